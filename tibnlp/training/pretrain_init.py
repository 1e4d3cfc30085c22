"""Where a pretraining run's weights start: a model directory (`pretrain.init_from`, with the
run's own vocabulary) or skip-gram vectors as the word embedding (`pretrain.skipgram`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from tibnlp.config import ModelConfig
from tibnlp.config.train import PretrainConfig
from tibnlp.errors import ConfigError, DataError
from tibnlp.models.electra import ElectraForPretraining
from tibnlp.models.io import (
    MISMATCH,
    WEIGHTS,
    check_vocab_of_weights,
    encoder_mismatches,
    load_pretrained,
    read_extra,
)
from tibnlp.models.pretraining import AlbertForPretraining
from tibnlp.text.vocab import Vocabulary
from tibnlp.training.engine import World, barrier
from tibnlp.training.skipgram import (
    cache_settings,
    cached_vectors,
    embedding_init,
    read_cached,
)


def initial_weights(
    model_dir: Path, vocab: Vocabulary, vocab_dir: Path
) -> tuple[ModelConfig, dict[str, torch.Tensor], dict[str, Any]]:
    """The shape, weights and recorded facts (tokens, FLOPs) of the model `pretrain.init_from`
    names; its vocabulary must be the run's, since the embedding rows are indexed by piece id."""
    model_cfg, state = load_pretrained(model_dir)
    try:
        own = Vocabulary.load(model_dir)
    except DataError as exc:
        raise DataError(
            f"pretrain.init_from: {model_dir} holds no vocabulary ({exc.message})",
            "point it at a model directory written by tibnlp pretrain",
        ) from exc
    check_vocab_of_weights(model_dir, own.sha256, model_dir)  # a folder mixing two runs
    if own.sha256 != vocab.sha256:
        raise ConfigError(
            f"pretrain.init_from: {model_dir} was trained with another vocabulary than "
            f"pretrain.vocab ({vocab_dir})",
            f"set pretrain.vocab={model_dir} (a model directory carries its vocabulary)",
        )
    if bad := encoder_mismatches(model_cfg, state):  # before the run writes anything
        raise DataError(
            f"pretrain.init_from: {model_dir / WEIGHTS} does not match its model.yaml: "
            f"{'; '.join(bad[:3])}",
            MISMATCH,
        )
    return model_cfg, state, read_extra(model_dir)


def objective_of(state: dict[str, torch.Tensor]) -> str:
    """The objective a saved pretraining model was trained with, read off its weights."""
    return "electra" if any(k.startswith("rtd_") for k in state) else "mlm"


def load_initial(
    model: torch.nn.Module, state: dict[str, torch.Tensor], source: Path, objective: str
) -> None:
    """Strict, except for the sentence-order and contrast heads, which one run may have and
    the other not.

    An MLM-pretrained encoder may start an ELECTRA run: it becomes the discriminator, and the
    generator and detection head start fresh (the generator's narrower shape has no source).
    The other way round is refused: an ELECTRA model has no MLM head of the encoder's width."""
    found = objective_of(state)
    if found == "mlm" and objective == "electra":
        state = {k: v for k, v in state.items() if k.startswith("encoder.")}
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [k for k in missing if k.startswith("encoder.")]
    elif found != objective:
        raise ConfigError(
            f"pretrain.init_from: {source} was pretrained with objective {found}, this run "
            f"trains {objective}",
            f"set pretrain.objective={found} to continue it",
        )
    else:
        missing, unexpected = model.load_state_dict(state, strict=False)
    bad = [k for k in [*missing, *unexpected] if not k.startswith(("sop_", "contrastive_"))]
    if bad:
        raise DataError(
            f"pretrain.init_from: {source} does not fit a pretraining model of its own "
            f"model.yaml (mismatched weights: {sorted(bad)[:5]})",
            "point it at a model directory written by tibnlp pretrain (not a classifier)",
        )


def skipgram_start(
    model: AlbertForPretraining | ElectraForPretraining,
    model_cfg: ModelConfig,
    p: PretrainConfig,
    train: Any,
    meta: dict[str, Any],
    vocab: Vocabulary,
    output: Path,
    world: World,
    resume: bool = False,
) -> dict[str, Any]:
    """Skip-gram vectors of the training examples' pieces as the word embedding; trained once
    on the main process (kept in OUTPUT/skipgram, so a resumed run reads them back), read by
    every rank. Returns their cost as the facts a continued run would carry (FLOPs, seconds).

    `resume`: the vectors the run started from are read back even where pretrain.skipgram
    changed since: the checkpoint's weights replace the embedding anyway, and training new
    vectors took minutes for nothing and recorded a warm start the run never had."""
    folder = output / "skipgram"
    args = (model_cfg.vocab_size, model_cfg.embedding_size, p.skipgram, p.seed)
    exclude = set(vocab.special_ids)
    key = meta["cache_key"]
    saved = read_cached(folder) if resume else None
    if saved is not None:
        result = saved[1]
        if world.is_main and saved[0] != cache_settings(*args, key):
            print(
                f"note: --resume keeps the skip-gram vectors the run started from ({folder}); "
                "changed pretrain.skipgram settings apply to a new run",
                file=sys.stderr,
                flush=True,
            )
    else:
        pieces = []  # the piece strings, for subword n-grams only
        if p.skipgram.ngram_buckets:
            pieces = [vocab.id_to_piece(i) for i in range(model_cfg.vocab_size)]
        if world.is_main:
            cached_vectors(folder, lambda: train["input_ids"], *args, exclude, key, pieces)
        barrier()
        result = cached_vectors(folder, lambda: train["input_ids"], *args, exclude, key, pieces)
    with torch.no_grad():
        model.encoder.embeddings.word.weight.copy_(embedding_init(result.vectors, p.skipgram.std))
    return {"flops": result.flops, "train_seconds": result.seconds, **result.facts()}
