"""The built-in stage kinds: thin adapters from a `StageContext` to the toolkit's stage functions.

Each adapter imports its function only when it runs, so a pipeline can be planned (and tested)
without the heavy layers. Where a function writes is decided here: always inside `ctx.output`.
"""

from __future__ import annotations

import importlib
import lzma
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tibnlp.errors import ConfigError
from tibnlp.pipeline.context import StageContext


def _call(target: str, *args: Any, **kwargs: Any) -> Any:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)(*args, **kwargs)


def _named(ctx: StageContext, key: str, required: bool = True) -> Path | None:
    if isinstance(ctx.inputs, dict) and key in ctx.inputs:
        return ctx.inputs[key]
    if required:
        raise ConfigError(
            f"stage {ctx.name}: needs an input named '{key}' (inputs: {{{key}: ...}})"
        )
    return None


def _documents(path: Path) -> Iterator[str]:
    """Blank-line separated documents of a plain or .xz text file, streamed."""
    opener = lzma.open if path.suffix == ".xz" else open
    lines: list[str] = []
    with opener(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                lines.append(line.rstrip("\n"))
            elif lines:
                yield "\n".join(lines)
                lines = []
    if lines:
        yield "\n".join(lines)


def slice_corpus(ctx: StageContext) -> Path:
    """The first `max_docs` documents (at most `max_chars` characters) of each input file.

    For smoke tests and quick starts on a reproducible slice of a real corpus.
    """
    max_docs = int(ctx.params.get("max_docs", 1000))
    max_chars = int(ctx.params.get("max_chars", 0))
    files = list(ctx.inputs.values()) if isinstance(ctx.inputs, dict) else list(ctx.inputs)
    if not files:
        raise ConfigError(f"stage {ctx.name}: give the corpus files to slice as inputs")
    out = ctx.output / "slice.txt"
    with out.open("w", encoding="utf-8") as fh:
        for path in files:
            chars = 0
            for i, doc in enumerate(_documents(Path(path))):
                if i >= max_docs or (max_chars and chars >= max_chars):
                    break
                fh.write(doc + "\n\n")
                chars += len(doc)
    return out


def prepare(ctx: StageContext) -> Path:
    files = list(ctx.inputs.values()) if isinstance(ctx.inputs, dict) else list(ctx.inputs)
    out = ctx.output / "corpus"
    _call("tibnlp.text.prepare:prepare_corpus", inputs=files, output=out, cfg=ctx.config.corpus)
    return out


def vocab(ctx: StageContext) -> Path:
    corpus = _named(ctx, "corpus")
    out = ctx.output / "vocab"
    _call("tibnlp.text.vocab:build_vocab", corpus_dir=corpus, output=out, cfg=ctx.config.vocab)
    return out


def pretrain(ctx: StageContext) -> Path:
    cfg = ctx.config
    cfg.pretrain.corpus = str(_named(ctx, "corpus"))
    cfg.pretrain.vocab = str(_named(ctx, "vocab"))
    cfg.pretrain.output = str(ctx.output / "model")
    return Path(_call("tibnlp.training.pretrain:run_pretraining", cfg, resume=ctx.resume))


def finetune(ctx: StageContext) -> dict[str, Any]:
    cfg = ctx.config
    model = _named(ctx, "model", required=False)
    if model is not None:
        cfg.finetune.model = str(model)
    cfg.finetune.output = str(ctx.output / "finetune")
    result = dict(_call("tibnlp.training.finetune:run_finetune", cfg) or {})
    register_finetuned(ctx, result)
    return result


def register_finetuned(ctx: StageContext, result: dict[str, Any]) -> None:
    """Register the fine-tuned model (when `tracking.register_model` names one) with its test
    metrics, unless the stage function did so itself (`result["registered_model"]`)."""
    name = ctx.config.tracking.register_model
    if not name or result.get("registered_model"):
        return
    model_dir = Path(result.get("model_dir") or Path(ctx.config.finetune.output))
    if not model_dir.is_dir():
        return
    metrics = {
        k: float(v)
        for k, v in result.items()
        if k.startswith("test") and isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    ctx.tracker.register_model(model_dir, name, metrics)
    result["registered_model"] = name
