"""Stage kinds -> stage functions, by dotted import path (nothing is imported until it runs).

A stage function takes a `StageContext` and returns a `Path` inside `ctx.output` (the stage's
output), a dict of results (logged as metrics), both as `(path, dict)`, or None (the output
is `ctx.output` itself).
`sections` lists the config sections that define the stage's result: only they enter its
content hash (less the settings that never change an output, `tibnlp.config.identity`), so
changing the fine-tuning settings does not re-prepare the corpus.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tibnlp.errors import ConfigError

ALL_SECTIONS = ("corpus", "vocab", "model", "pretrain", "finetune", "engine")


@dataclass(frozen=True)
class StageDef:
    target: str | Callable[..., Any]  # "package.module:function" or the function itself
    sections: tuple[str, ...] = ALL_SECTIONS

    def load(self) -> Callable[..., Any]:
        if callable(self.target):
            return self.target
        module, _, attr = self.target.partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(
                f"stage function {self.target} cannot be loaded: {exc}",
                "is that part of tibnlp installed? (pip install -e .)",
            ) from exc


_REGISTRY: dict[str, StageDef] = {
    "slice": StageDef("tibnlp.pipeline.stages:slice_corpus", ()),
    "prepare": StageDef("tibnlp.pipeline.stages:prepare", ("corpus",)),
    "vocab": StageDef("tibnlp.pipeline.stages:vocab", ("vocab",)),
    "pretrain": StageDef("tibnlp.pipeline.stages:pretrain", ("model", "pretrain", "engine")),
    "finetune": StageDef("tibnlp.pipeline.stages:finetune", ("model", "finetune", "engine")),
    "curve": StageDef("tibnlp.pipeline.stages:curve", ()),
}


def register_stage(
    kind: str, target: str | Callable[..., Any], sections: tuple[str, ...] = ALL_SECTIONS
) -> None:
    """Add or replace a stage kind (plugins, tests)."""
    _REGISTRY[kind] = StageDef(target, tuple(sections))


def stage_def(kind: str) -> StageDef:
    """A registered kind, or a dotted path `module:function` used directly."""
    if kind in _REGISTRY:
        return _REGISTRY[kind]
    if ":" in kind:
        return StageDef(kind)
    raise ConfigError(
        f"unknown stage kind {kind!r}",
        f"known kinds: {', '.join(sorted(_REGISTRY))}, or give module:function",
    )


def known_kinds() -> list[str]:
    return sorted(_REGISTRY)
