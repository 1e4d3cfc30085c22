"""Settings of training: hyperparameters (what is learned) apart from speed knobs (how fast).

As in cramming, `EngineConfig` holds what changes speed but must not change results
(precision aside): ZeRO stage, precision, threads, loader workers. `PretrainConfig` holds what
changes the model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from tibnlp.config.core import check, check_seed
from tibnlp.errors import ConfigError

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([hms])")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0}


def parse_duration(text: str) -> float | None:
    """Seconds in "2h", "30m", "90s", "1h30m" or a bare number of seconds; "" -> None (no limit)."""
    text = text.strip().lower()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        pos, seconds = 0, 0.0
        for match in _DURATION.finditer(text):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
            pos = match.end()
        if pos != len(text) or pos == 0:
            raise ConfigError(
                f"time budget {text!r} is not a duration",
                'write it like "2h", "30m", "90s" or "1h30m"',
            ) from None
    if not 0 < seconds < float("inf"):  # also nan, which compares false either way
        raise ConfigError(f"time budget {text!r} must be positive and finite")
    return seconds


@dataclass
class OptimizerConfig:
    name: Literal["adamw", "lamb"] = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-6
    warmup_steps: int = 100
    schedule: Literal["linear", "cosine", "constant"] = "linear"
    min_lr_ratio: float = 0.0
    grad_clip: float = 1.0

    def validate(self, prefix: str) -> None:
        check(self.lr > 0, f"{prefix}.lr", "must be > 0")
        check(len(self.betas) == 2, f"{prefix}.betas", "must be two numbers")
        check(all(0.0 <= b < 1.0 for b in self.betas), f"{prefix}.betas", "must be in [0, 1)")
        check(self.eps >= 0, f"{prefix}.eps", "must be >= 0")
        check(self.weight_decay >= 0, f"{prefix}.weight_decay", "must be >= 0")
        check(self.warmup_steps >= 0, f"{prefix}.warmup_steps", "must be >= 0")
        check(0.0 <= self.min_lr_ratio <= 1.0, f"{prefix}.min_lr_ratio", "must be in [0, 1]")
        check(self.grad_clip >= 0, f"{prefix}.grad_clip", "must be >= 0 (0: no clipping)")


@dataclass
class EngineConfig:
    """Speed knobs: DeepSpeed and runtime settings.

    `compile`: torch.compile of the model inside the engine (off by default). On the CPU it
    bought no tokens/s at ALBERT-tiny's shape (torch 2.13, inductor: the GEMMs already run in
    oneDNN) after a ~80 s first step; on GPUs the speed benchmark's compiled model ran 1.1x to
    1.9x its eager tokens/s (H100 and H200, sequence 128 and 512, benchmarks/results/gpu.md);
    what it buys in the host-bound pretraining loop is not measured yet. `aot_eager` traces
    without generating code: a check that a model compiles.
    """

    zero_stage: int = 0
    # auto: bf16 on a GPU that has it (else fp16), fp32 on CPU (a default run's numbers do not
    # depend on the CPU model). bf16 on CPU: autocast with fp32 weights/optimizer; needs native
    # bf16 instructions (AVX512-BF16/AMX); faster, resumes exactly, differs from fp32.
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    threads: int = 0  # torch intra-op threads per process; 0: cores / processes
    num_workers: int = 0
    backend: Literal["auto", "gloo", "nccl"] = "auto"  # auto: nccl on GPU, gloo on CPU
    port: int = 0  # rendezvous port for a single process without a launcher; 0: a free one
    compile: Literal["off", "inductor", "aot_eager"] = "off"

    def validate(self, prefix: str) -> None:
        check(self.zero_stage in (0, 1, 2), f"{prefix}.zero_stage", "allowed values: 0, 1, 2")
        check(0 <= self.port < 65536, f"{prefix}.port", "must be a port number or 0")
        check(self.threads >= 0, f"{prefix}.threads", "must be >= 0")


@dataclass
class SkipgramConfig:
    """Skip-gram word vectors trained on the pretraining tokens before the first MLM step, as
    the encoder's word embedding (tibnlp.training.skipgram). epochs 0: off."""

    epochs: int = 0
    window: int = 5  # largest context distance, in pieces
    negatives: int = 5  # noise pieces per pair, drawn from unigram^0.75
    subsample: float = 1e-4  # word2vec's frequent-piece threshold t; 0: keep all
    lr: float = 0.005  # SparseAdam peak rate, decayed linearly to 0
    batch_pairs: int = 8192
    std: float = 0.1  # per-component std of the table the vectors become (see embedding_init)
    # fastText's subword vectors: a piece's vector is the mean of its own row and those of its
    # character n-grams (ngram_min..ngram_max chars), hashed into this many rows; 0: word2vec
    ngram_buckets: int = 0
    ngram_min: int = 3
    ngram_max: int = 5

    def validate(self, prefix: str) -> None:
        check(self.epochs >= 0, f"{prefix}.epochs", "must be >= 0 (0: off)")
        check(self.ngram_buckets >= 0, f"{prefix}.ngram_buckets", "must be >= 0 (0: off)")
        check(self.ngram_min >= 1, f"{prefix}.ngram_min", "must be >= 1")
        check(self.ngram_max >= self.ngram_min, f"{prefix}.ngram_max", "must be >= ngram_min")
        check(self.window >= 1, f"{prefix}.window", "must be >= 1")
        check(self.negatives >= 1, f"{prefix}.negatives", "must be >= 1")
        check(0.0 <= self.subsample < 1.0, f"{prefix}.subsample", "must be in [0, 1)")
        check(self.lr > 0, f"{prefix}.lr", "must be > 0")
        check(self.batch_pairs >= 1, f"{prefix}.batch_pairs", "must be >= 1")
        check(self.std > 0, f"{prefix}.std", "must be > 0")


@dataclass
class PretrainConfig:
    """MLM + SOP pretraining (MODELS.md section 1)."""

    corpus: str = ""  # prepared corpus directory
    vocab: str = ""  # vocabulary directory
    # a pretrained model directory to continue from (e.g. task-adaptive pretraining on a
    # task's own training text): its weights, shape and vocabulary; the optimizer and the
    # schedule start afresh. The model section is then read from that directory.
    init_from: str = ""
    output: str = "runs/pretrain"
    seq_len: int = 128
    batch_size: int = 32  # global batch (sequences per optimizer step)
    micro_batch_size: int = 0  # per process; 0: batch_size / processes (no accumulation)
    max_steps: int = 1000
    time_budget: str = ""  # e.g. "2h", "30m"; empty: no limit
    # stop after this many training tokens (non-padding, all processes); 0: no limit. With a
    # time budget, whichever is reached first ends the run; either drives the lr schedule.
    max_tokens: float = 0.0
    mask_prob: float = 0.15  # share of real tokens (pieces) predicted, in either masking
    max_ngram: int = 3
    # span: n-grams of whole syllables; whole_word: n-grams of whole botok words (the corpus
    # needs its words: `tibnlp corpus words CORPUS` or corpus.words: true at preparation)
    masking: Literal["span", "whole_word"] = "span"
    # rare-first masking: span starts drawn with weight p^-mask_rarity, p the unigram
    # probability of the unit's rarest piece (tibnlp.data.masking); the same share of pieces is
    # masked, more of them rare. Held-out MLM accuracy keeps uniform masks. 0: ALBERT's uniform
    mask_rarity: float = 0.0
    # sentence-order prediction; off: MLM only, segments kept in order, and a one-sentence
    # chunk (a title of the title stage) is one segment, `[CLS] text [SEP]`, as fine-tuning
    # reads a text
    sop: bool = True
    sop_prob: float = 0.5  # share of swapped pairs when sop is on
    # mlm: predict the masked pieces. electra: a small generator fills the masks and the
    # encoder tells, for every real token, original from replaced (tibnlp.models.electra)
    objective: Literal["mlm", "electra"] = "mlm"
    # weight of a same-document contrast beside MLM (tibnlp.models.pretraining): each example's
    # two stretches become two rows that must find each other in the batch; 0: off. MLM only,
    # sop off, no segment recurrence
    contrastive: float = 0.0
    contrastive_temperature: float = 0.05
    generator_ratio: float = 0.5  # electra: the generator's width / the encoder's
    rtd_weight: float = 50.0  # electra: weight of the detection loss beside the generator's
    # model.recurrence.mem_len > 0: consecutive seq_len segments of one document per example
    recurrence_segments: int = 4
    # write OUTPUT/exports/tokens-<N>/ (a model directory) when the non-padding tokens trained
    # on first reach each N: the points of a learning curve from one run
    export_at_tokens: list[float] = field(default_factory=list)
    # share of the run (steps or time budget) after which a held-out MLM accuracy still at the
    # unigram level is reported as "not learning" (log line and MLflow tag); 0: never
    warn_after: float = 0.25
    eval_every: int = 200
    eval_batches: int = 20
    log_every: int = 10
    checkpoint_every: int = 200
    keep_checkpoints: int = 2
    seed: int = 42
    # Last encoder layer only at the positions the heads read (masked tokens, [CLS]); exact,
    # ~20% less encoder work. Designs whose attention cannot (windows, relative, fusion) run
    # the full layer regardless.
    sparse_last_layer: bool = True
    # word vectors from a skip-gram pass over the same tokens as the word embedding's start
    skipgram: SkipgramConfig = field(default_factory=SkipgramConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    # peak lr of the word-piece table alone (and the MLM decoder tied to it; not the rest of
    # the embedding layer, unlike finetune.embedding_lr); 0: optimizer.lr. A low rate keeps
    # skip-gram vectors from being washed out by the first MLM steps (embedding_levers.md)
    word_lr: float = 0.0

    def __post_init__(self) -> None:
        # a set of token counts (the loop exports in token order): kept sorted, so listing
        # them in another order is the same config and the same pipeline cache key
        self.export_at_tokens = sorted(self.export_at_tokens)

    def validate(self, prefix: str) -> None:
        check(self.seq_len >= 8, f"{prefix}.seq_len", "must be >= 8")
        check(self.batch_size >= 1, f"{prefix}.batch_size", "must be >= 1")
        check(0.0 < self.mask_prob < 1.0, f"{prefix}.mask_prob", "must be in (0, 1)")
        check(1 <= self.max_ngram <= 10, f"{prefix}.max_ngram", "must be in [1, 10]")
        # past ~50 the order is already strictly rarest-first; far past it p^-a overflows
        check(
            0 <= self.mask_rarity <= 100,
            f"{prefix}.mask_rarity",
            "must be in [0, 100] (0: uniform)",
        )
        check(0.0 <= self.sop_prob <= 1.0, f"{prefix}.sop_prob", "must be in [0, 1]")
        check(0.0 < self.generator_ratio <= 1.0, f"{prefix}.generator_ratio", "must be in (0, 1]")
        check(self.rtd_weight > 0, f"{prefix}.rtd_weight", "must be > 0")
        if self.objective == "electra":
            check(
                not self.sop,
                f"{prefix}.sop",
                "must be false with objective electra (replaced-token detection has no pair task)",
            )
        check(self.contrastive >= 0, f"{prefix}.contrastive", "must be >= 0 (0: off)")
        check(self.contrastive_temperature > 0, f"{prefix}.contrastive_temperature", "must be > 0")
        if self.contrastive:
            check(
                not self.sop and self.objective == "mlm",
                f"{prefix}.contrastive",
                "needs pretrain.sop=false and objective mlm (its rows are the pair's segments)",
            )
        check(self.max_tokens >= 0, f"{prefix}.max_tokens", "must be >= 0 (0: no limit)")
        check(self.word_lr >= 0, f"{prefix}.word_lr", "must be >= 0 (0 = optimizer.lr)")
        check(0.0 <= self.warn_after <= 1.0, f"{prefix}.warn_after", "must be in [0, 1]")
        for i, n in enumerate(self.export_at_tokens):
            check(n >= 1, f"{prefix}.export_at_tokens[{i}]", "must be a token count >= 1")
        # distinct as their folders (tokens-N, the whole part): 1000.2 and 1000.7 passed and
        # the second export replaced the first
        whole = [int(n) for n in self.export_at_tokens]
        fraction = any(n != int(n) for n in self.export_at_tokens)
        check(
            len(set(whole)) == len(whole),
            f"{prefix}.export_at_tokens",
            "must be distinct token counts"
            + (
                " as whole numbers (each exports to tokens-N, N its whole part)" if fraction else ""
            ),
        )
        check(self.max_steps >= 1, f"{prefix}.max_steps", "must be >= 1")
        check(
            not (self.skipgram.epochs and self.init_from),
            f"{prefix}.skipgram.epochs",
            "must be 0 with pretrain.init_from (the word embedding comes from that model)",
        )
        check(bool(self.output.strip()), f"{prefix}.output", "must name a folder")
        check(self.recurrence_segments >= 1, f"{prefix}.recurrence_segments", "must be >= 1")
        check(self.micro_batch_size >= 0, f"{prefix}.micro_batch_size", "must be >= 0")
        # the part of the batch split that needs no process count: refused as the config is
        # read (the process count is checked when the run starts, before tokenising)
        check(
            not self.micro_batch_size or self.batch_size % self.micro_batch_size == 0,
            f"{prefix}.batch_size",
            f"{self.batch_size} is not a multiple of {prefix}.micro_batch_size "
            f"({self.micro_batch_size}): batch_size = micro_batch_size x processes x "
            "accumulation steps",
        )
        for key in ("eval_every", "log_every", "checkpoint_every", "keep_checkpoints"):
            check(getattr(self, key) >= 1, f"{prefix}.{key}", "must be >= 1")
        check(self.eval_batches >= 0, f"{prefix}.eval_batches", "must be >= 0")
        check_seed(self.seed, f"{prefix}.seed")
        try:
            parse_duration(self.time_budget)
        except ConfigError as exc:
            raise ConfigError(
                f"config key '{prefix}.time_budget': {exc.message}", exc.hint
            ) from exc
