"""Stage kinds -> stage functions (the adapters of `tibnlp.pipeline.stages`, or any function
a plugin or test registers). The adapters import the heavy layers only when they run.

A stage function takes a `StageContext` and returns a `Path` inside `ctx.output` (the stage's
output), a dict of results (logged as metrics), both as `(path, dict)`, or None (the output
is `ctx.output` itself).
`sections` lists the config sections that define the stage's result: only they enter its
content hash (less the settings that never change an output, `tibnlp.config.identity`), so
changing the fine-tuning settings does not re-prepare the corpus.
`accepts` (or the function's own `@accepts`) names the inputs and params the kind reads; the
pipeline file is checked against it when it loads. A kind that declares nothing is not checked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tibnlp.errors import ConfigError
from tibnlp.pipeline import stages
from tibnlp.pipeline.context import Accepts, declared

ALL_SECTIONS = ("corpus", "vocab", "model", "pretrain", "finetune", "engine")


@dataclass(frozen=True)
class StageDef:
    function: Callable[..., Any]
    sections: tuple[str, ...] = ALL_SECTIONS
    # (config key, input name) the function sets itself from that input ("": to a folder in
    # its output): pinned at its default in the content hash when the node has that input
    fills: tuple[tuple[str, str], ...] = ()
    given: Accepts | None = None  # register_stage's `accepts`, over the function's own
    # the data-directory files the stage reads by name from its resolved config (not as
    # inputs), by content hash: a cached output made from other content reruns
    data: Callable[[dict[str, Any]], dict[str, str]] | None = None
    # config keys listing extra sets the stage scores from its published output (not in its
    # key: one newly asked reruns the stage on a copy of it, `pipeline.freshness`)
    rescored: tuple[str, ...] = ()

    def load(self) -> Callable[..., Any]:
        return self.function

    @property
    def accepts(self) -> Accepts | None:
        """What the kind reads; None: undeclared, so unchecked."""
        return self.given or declared(self.function)


_REGISTRY: dict[str, StageDef] = {
    "slice": StageDef(stages.slice_corpus, ()),
    "prepare": StageDef(stages.prepare, ("corpus",)),
    "vocab": StageDef(stages.vocab, ("vocab",)),
    "pretrain": StageDef(stages.pretrain, ("model", "pretrain", "engine"), stages.PRETRAIN_FILLS),
    "finetune": StageDef(
        stages.finetune,
        ("model", "finetune", "engine"),
        stages.FINETUNE_FILLS,
        data=stages.finetune_data,
        rescored=("finetune.eval_also",),
    ),
    "curve": StageDef(stages.curve, ()),
}


def register_stage(
    kind: str,
    function: Callable[..., Any],
    sections: tuple[str, ...] = ALL_SECTIONS,
    fills: tuple[tuple[str, str], ...] = (),
    accepts: Accepts | None = None,
    data: Callable[[dict[str, Any]], dict[str, str]] | None = None,
    rescored: tuple[str, ...] = (),
) -> None:
    """Add or replace a stage kind (plugins, tests)."""
    _REGISTRY[kind] = StageDef(
        function, tuple(sections), tuple(fills), accepts, data, tuple(rescored)
    )


def stage_def(kind: str) -> StageDef:
    """A registered kind."""
    if kind in _REGISTRY:
        return _REGISTRY[kind]
    raise ConfigError(
        f"unknown stage kind {kind!r}",
        f"known kinds: {', '.join(sorted(_REGISTRY))} (a plugin adds one with register_stage)",
    )


def known_kinds() -> list[str]:
    return sorted(_REGISTRY)
