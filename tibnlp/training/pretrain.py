"""`run_pretraining`: ALBERT MLM + SOP on the DeepSpeed engine, from a config to a model dir.

What differs from any other training is here (data, model, what is logged); the step, eval,
checkpoint and stop logic is `loop.TrainLoop`. Output layout:

    OUTPUT/config.yaml        the resolved config of the run
    OUTPUT/data/              tokenised SOP examples (built once by rank 0, then cached)
    OUTPUT/data-heldout/      the held-out split alone, tokenised by `--eval-only`
    OUTPUT/eval.json          `--eval-only`'s scores, OUTPUT/eval-config.yaml its config (a
                              training run's config.yaml in the same folder stays as it is)
    OUTPUT/checkpoints/       DeepSpeed checkpoints + `latest` marker (resume point)
    OUTPUT/model/             model.safetensors + model.yaml + vocabulary: `finetune --model`
    OUTPUT/exports/tokens-N/  the same, as it was when N training tokens were reached
                              (`pretrain.export_at_tokens`): the points of a learning curve

Every model directory records in its metadata (`read_extra`) the step, the tokens trained on,
the training seconds, the analytic FLOPs and the hardware, so a curve can be drawn against
tokens, FLOPs or CPU-hours (`pretrain_record`). The refusals that come before anything is
written are `pretrain_checks`; where the weights start, `pretrain_init`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tibnlp.config import Config, ModelConfig, dump_yaml
from tibnlp.config.train import PretrainConfig, parse_duration
from tibnlp.data.masking import MlmCollator
from tibnlp.data.pretraining import (
    SPLITS,
    OtherInputsError,
    build_pretraining_dataset,
    length_bucketed_batches,
    load_pretraining_dataset,
    require_documents,
)
from tibnlp.evaluation.word_order import order_accuracies
from tibnlp.models.objectives import Model, pretraining_model
from tibnlp.stopping import ended_status
from tibnlp.text.vocab import Vocabulary
from tibnlp.tracking import Tracker, require_store
from tibnlp.training.batches import ShardedBatches
from tibnlp.training.engine import (
    World,
    accumulation_steps,
    init_distributed,
    planned_world_size,
    shutdown,
)
from tibnlp.training.fit import fit
from tibnlp.training.held_output import NoteRun, held_output
from tibnlp.training.learning_check import LearningCheck, unigram_accuracy
from tibnlp.training.loop import LoopSettings, TrainLoop
from tibnlp.training.pretrain_checks import (
    note_missed_exports,
    note_spent,
    require_enough_examples,
    require_folder_path,
    require_inputs_named,
    require_no_earlier_run,
    require_same_model,
    require_seq_len_fits,
    resumed_on_other_data,
    segment_chain,
)
from tibnlp.training.pretrain_init import initial_weights, load_initial, skipgram_start
from tibnlp.training.pretrain_record import RunRecord, model_facts
from tibnlp.training.ranks import wait_for_main
from tibnlp.training.wiring import Training, start_training

EVAL_SEED_OFFSET = 1_000_003  # held-out masks differ from any training batch's


def resolve_model_config(model: ModelConfig, vocab_size: int, meta: dict[str, Any]) -> ModelConfig:
    """The vocabulary's real size and, for `heads.threshold: auto`, the corpus median length."""
    heads = model.heads
    if heads.threshold == "auto":
        heads = dataclasses.replace(heads, threshold=round(float(meta["median_length"])))
    return dataclasses.replace(model, vocab_size=vocab_size, heads=heads)


def dataset_rows(dataset: Any, indices: Sequence[int]) -> list[dict[str, Any]]:
    """Rows `indices` of a tokenised split as one dict per example (what a collator reads)."""
    cols = dataset[list(indices)]
    return [dict(zip(cols, values, strict=True)) for values in zip(*cols.values(), strict=True)]


def _batches(
    dataset: Any, collator: MlmCollator, batch_size: int, seed: int, training: Training
) -> ShardedBatches:
    lengths = list(dataset["length"])

    def plan(epoch: int) -> list[list[int]]:
        return length_bucketed_batches(lengths, batch_size, seed, epoch)

    def collate(indices: Sequence[int], key: int) -> dict[str, torch.Tensor]:
        return collator(dataset_rows(dataset, indices), key)

    return training.batches(plan, collate, batch_size)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def run_pretraining(
    cfg: Config, resume: bool = False, wait: bool = False, eval_only: bool = False
) -> Path:
    """Train (or continue) the run that `cfg.pretrain.output` names; returns OUTPUT/model.
    With `eval_only`, score `pretrain.init_from` on the corpus's held-out split instead (no
    step, no checkpoint) and return OUTPUT/eval.json.

    The main process holds the output folder (`tibnlp.folder_lock`) for the whole run, so a
    second run on it refuses at once (or with `wait`, starts when the first is done) instead
    of interleaving checkpoints.
    """
    p = cfg.pretrain
    require_inputs_named(p, resume, eval_only)
    require_folder_path(Path(p.output))
    # the batch split over the processes, before the process group, the output folder and
    # the corpus's tokenising (minutes): start_training would refuse it only after them
    accumulation_steps(p.batch_size, p.micro_batch_size, planned_world_size())
    world = init_distributed(cfg.engine)
    standalone = not cfg.tracking.run_id  # (a pipeline ends its own killed stages)
    # (the other ranks wait for rank 0 with --wait as long as it takes)
    with held_output(Path(p.output), world.is_main, standalone, wait, wait_for_main) as note_run:
        return _pretrain(cfg, resume, world, note_run, eval_only)


@dataclasses.dataclass(frozen=True)
class _Inputs:
    """A run's inputs once checked and tokenised: what building and training the model read."""

    vocab: Vocabulary
    splits: Any  # "train" and "heldout" (--eval-only: "heldout" alone)
    meta: dict[str, Any]  # the tokenised data's facts (lengths, counts, cache key)
    model_cfg: ModelConfig  # resolved: the vocabulary's size, the heads' threshold
    chain: int  # segments per chain (segment recurrence), 0 without
    init_state: dict[str, torch.Tensor] | None  # the weights of pretrain.init_from
    before: dict[str, Any]  # the facts (tokens, FLOPs) of the model a run continues from
    config_path: Path  # the run's config file (--eval-only's beside its eval.json)


def _pretrain(
    cfg: Config, resume: bool, world: World, note_run: NoteRun, eval_only: bool = False
) -> Path:
    """The run, in its held folder: check and tokenise, build, train (or score), export."""
    p = cfg.pretrain
    budget = parse_duration(p.time_budget)
    inputs = _checked_inputs(cfg, resume, world, eval_only)
    _seed_everything(p.seed)  # identical initial weights on every rank
    model, before = _build_model(cfg, inputs, world, resume)
    rates = {"encoder.embeddings.word.": p.word_lr}  # (ELECTRA's generator shares it)
    training = start_training(
        model, cfg.engine, p.optimizer, p.batch_size, p.micro_batch_size, p.max_steps, world, rates
    )
    _seed_everything(p.seed + 7919 * world.rank)  # distinct dropout streams per rank
    train, heldout = _streams(p, inputs, training, eval_only)
    settings = _loop_settings(p, budget)
    facts = model_facts(p, inputs.model_cfg, inputs.vocab, world.size, before)
    record = RunRecord(cfg, inputs.model_cfg, facts, training, inputs.meta, inputs.config_path)
    loop = training.loop(train, heldout, settings, exporter=record.export)
    check = _learning_check(p, inputs, loop, heldout, world)
    loop.extra_state["learning_check"] = check  # a resumed run neither warns nor probes again
    if eval_only:
        assert heldout is not None  # (refused by require_enough_examples otherwise)
        return _score_heldout(p, loop, heldout, check, record, world)
    return _train_and_export(p, resume, loop, check, record, world, note_run)


def _checked_inputs(cfg: Config, resume: bool, world: World, eval_only: bool) -> _Inputs:
    """The checks, in the order tests pin, then the tokenised splits and (a new run's)
    config.yaml: a refused run leaves no config describing a run that never started."""
    p = cfg.pretrain
    output = Path(p.output)
    if not eval_only:  # (in the held folder: a run busy in it is named first)
        require_no_earlier_run(output, resume)
    vocab_dir = Path(p.vocab)
    vocab = Vocabulary.load(vocab_dir)
    init_state = None
    before: dict[str, Any] = {}
    if p.init_from:
        cfg.model, init_state, before = initial_weights(Path(p.init_from), vocab, vocab_dir)
    if resume:  # before config.yaml is written over: it must keep describing the checkpoints
        require_same_model(output, cfg, world.is_main)
    require_seq_len_fits(p, cfg.model.max_len)  # (init_from's model's max_len)
    # an empty split the run reads, before its config and tokenised data are written
    require_documents(Path(p.corpus), "heldout" if eval_only else "train")
    chain = segment_chain(cfg)
    # --eval-only scores the held-out split: it tokenises that split alone, into a folder of
    # its own (a training run's data/ in the same output stays as it is)
    data_dir = output / ("data-heldout" if eval_only else "data")
    if world.is_main:  # (the store the run logs to opens first: one that cannot, fails here)
        require_store(cfg.tracking)
        _tokenise(cfg, vocab, data_dir, chain, resume, eval_only)
    wait_for_main(f"tokenise {data_dir}")  # (it may outlast a collective's timeout)
    splits, meta = load_pretraining_dataset(data_dir)
    model_cfg = resolve_model_config(cfg.model, vocab.size, meta)
    require_enough_examples(p, splits, data_dir, output, eval_only, world.is_main)
    # a resumed run's config is written once its checkpoint has loaded (open_tracker);
    # --eval-only's beside its eval.json, so that a training run's config.yaml in the same
    # folder keeps describing that run's checkpoints
    config_path = output / ("eval-config.yaml" if eval_only else "config.yaml")
    if world.is_main and not resume:
        dump_yaml(cfg, config_path)
    return _Inputs(vocab, splits, meta, model_cfg, chain, init_state, before, config_path)


def _tokenise(
    cfg: Config, vocab: Vocabulary, data_dir: Path, chain: int, resume: bool, eval_only: bool
) -> None:
    """The main process's tokenising of the corpus into `data_dir` (kept there, and read
    back by a later run with the same inputs)."""
    p = cfg.pretrain
    output = Path(p.output)
    output.mkdir(parents=True, exist_ok=True)
    num_proc = cfg.engine.num_workers or (os.cpu_count() or 1)
    try:
        build_pretraining_dataset(
            Path(p.corpus),
            vocab,
            p.seq_len,
            data_dir,
            p.seed,
            num_proc,
            segments=chain,
            sop_prob=p.sop_prob if p.sop else 0.0,
            masking=p.masking,
            splits=("heldout",) if eval_only else SPLITS,
            # a one-sentence chunk is cut into A and B only for a task that reads the pair
            pairs=p.sop or p.contrastive > 0,
        )
    except OtherInputsError as exc:
        if not resume:
            raise
        raise resumed_on_other_data(data_dir, output) from exc


def _build_model(
    cfg: Config, inputs: _Inputs, world: World, resume: bool
) -> tuple[Model, dict[str, Any]]:
    """The model with its starting weights (random, init_from's, or skip-gram vectors as the
    word embedding), and the facts of where they came from."""
    p, model_cfg = cfg.pretrain, inputs.model_cfg
    model = pretraining_model(model_cfg, p, p.seq_len if inputs.chain else 0)
    before = inputs.before
    if inputs.init_state is not None:
        load_initial(model, inputs.init_state, Path(p.init_from), p.objective)
    if p.skipgram.epochs:
        train, output = inputs.splits["train"], Path(p.output)
        before = skipgram_start(
            model, model_cfg, p, train, inputs.meta, inputs.vocab, output, world, resume
        )
    return model, before


def _streams(
    p: PretrainConfig, inputs: _Inputs, training: Training, eval_only: bool
) -> tuple[ShardedBatches, ShardedBatches | None]:
    """The training batches and the held-out ones (None without a full held-out batch)."""
    splits, vocab = inputs.splits, inputs.vocab
    whole_word = p.masking == "whole_word"
    pairs = p.contrastive > 0  # each example's segments as two rows (same-document contrast)
    heldout = None
    if p.eval_batches and len(splits["heldout"]) >= p.batch_size:
        heldout = _batches(
            splits["heldout"],
            MlmCollator(
                vocab, p.mask_prob, p.max_ngram, p.seed + EVAL_SEED_OFFSET, whole_word, pairs
            ),
            p.batch_size,
            p.seed,
            training,
        )
    if eval_only:  # no train split was tokenised; no step is taken, so `train` is not drawn
        assert heldout is not None  # (refused by require_enough_examples otherwise)
        return heldout, heldout
    train = _batches(
        splits["train"],
        MlmCollator(vocab, p.mask_prob, p.max_ngram, p.seed, whole_word, pairs, p.mask_rarity),
        p.batch_size,
        p.seed,
        training,
    )
    return train, heldout


def _loop_settings(p: PretrainConfig, budget: float | None) -> LoopSettings:
    return LoopSettings(
        max_steps=p.max_steps,
        log_every=p.log_every,
        eval_every=p.eval_every,
        eval_batches=p.eval_batches,
        checkpoint_every=p.checkpoint_every,
        keep_checkpoints=p.keep_checkpoints,
        checkpoint_dir=Path(p.output) / "checkpoints",
        time_budget_s=budget,
        max_tokens=p.max_tokens,
        export_at_tokens=list(p.export_at_tokens),
    )


def _order_probe(
    loop: TrainLoop, heldout: ShardedBatches, eval_batches: int, electra: bool
) -> tuple[float, float]:
    """Accuracy on the held-out batches the loop evaluates, as written and shuffled."""
    heldout.reset()
    batches = [
        loop.to_device(raw)
        for _ in range(min(max(eval_batches, 1), len(heldout)))
        for raw in heldout.next()
    ]
    mlm = loop.engine.module.generator if electra else loop.engine.module  # predicts masks
    return order_accuracies(mlm, batches)


def _learning_check(
    p: PretrainConfig,
    inputs: _Inputs,
    loop: TrainLoop,
    heldout: ShardedBatches | None,
    world: World,
) -> LearningCheck:
    """Warns once when held-out accuracy stays at the unigram level or ignores word order
    (not with segment chains); off without held-out batches."""
    special = set(inputs.vocab.special_ids)
    unigram = unigram_accuracy(inputs.splits["heldout"], special) if heldout else 0.0
    probe = None
    if heldout is not None and not inputs.chain:
        electra = p.objective == "electra"
        probe = functools.partial(_order_probe, loop, heldout, p.eval_batches, electra)
    return LearningCheck(
        unigram,
        p.warn_after if heldout else 0.0,
        lambda at: max(at.step / p.max_steps, loop.budget_fraction()),
        probe,
        say=world.is_main,
    )


def _score_heldout(
    p: PretrainConfig,
    loop: TrainLoop,
    heldout: ShardedBatches,
    check: LearningCheck,
    record: RunRecord,
    world: World,
) -> Path:
    """--eval-only: the held-out scores of init_from's model (no step, no checkpoint)."""
    scores = {f"eval/{k}": v for k, v in loop.evaluate().items()}
    scores["eval/unigram_accuracy"] = check.unigram
    if world.is_main:
        rows = min(p.eval_batches, len(heldout)) * p.batch_size
        record.scores(record.open_tracker(False, None), scores, rows)
    shutdown(world)
    return Path(p.output) / "eval.json"


def _train_and_export(
    p: PretrainConfig,
    resume: bool,
    loop: TrainLoop,
    check: LearningCheck,
    record: RunRecord,
    world: World,
    note_run: NoteRun,
) -> Path:
    """Train to the end (or the budget), then write OUTPUT/model and end the MLflow run."""

    def open_and_watch(run_id: str | None) -> Tracker:
        check.tracker = record.open_tracker(resume, run_id)
        note_run(check.tracker)  # a SIGKILL ends no run: the next run in this folder ends it
        return check.tracker

    try:
        result = fit(loop, resume, open_and_watch, on_eval=check)
        if result.spent_before and world.is_main:
            note_spent(result.spent_before, loop.step, loop.tokens, loop.train_seconds)
        if world.is_main:
            note_missed_exports(p.export_at_tokens, loop.tokens, loop.step, result.stopped_by)
            record.final_model(loop.progress, result)
    except BaseException as exc:
        if check.tracker is not None:  # (fit ended it already; a later step did not)
            check.tracker.end(ended_status(exc))
        raise
    shutdown(world)
    return Path(p.output) / "model"
