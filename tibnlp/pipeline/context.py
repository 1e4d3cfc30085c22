"""What a stage function receives, and what a stage kind declares it reads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tibnlp.config import Config
from tibnlp.tracking import Tracker

F = TypeVar("F", bound=Callable[..., Any])
ACCEPTS_ATTR = "tibnlp_accepts"


@dataclass
class StageContext:
    name: str  # node name, e.g. "pretrain[small=6]"
    stage: str  # stage name in the pipeline file
    variant: str
    config: Config  # fully resolved; `config.tracking.run_id` is this stage's MLflow run
    inputs: list[Path] | dict[str, Path]
    output: Path  # write here (a partial directory, published when the function returns)
    resume: bool  # the partial directory is left from an interrupted run
    tracker: Tracker
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Accepts:
    """The inputs and params a stage kind reads, checked when the pipeline loads: a misspelt
    or missing name fails `--dry-run`, not the real run after the stages above it ran."""

    needs: tuple[str, ...] = ()  # input names it must have (`inputs: {NAME: ...}`)
    may: tuple[str, ...] = ()  # input names it may have
    files: bool = False  # reads a non-empty list of files instead (a mapping: any names)
    params: tuple[str, ...] = ()  # the `params` keys it reads
    # checks the resolved params' values (raising ConfigError), when the plan is made: a
    # `--set vars.docs=abc` fails `--dry-run`, not the stage's int() after the stages above it
    check: Callable[[dict[str, Any]], None] | None = None

    def inputs_text(self) -> str:
        """The inputs, as the user writes them in a hint."""
        if self.files:
            return "a list of files, e.g. [data:FOLDER/FILE, ${stages.STAGE.output}]"
        names = [*self.needs, *(f"{n} (optional)" for n in self.may)]
        return ", ".join(names) or "none"


def accepts(
    needs: tuple[str, ...] = (),
    may: tuple[str, ...] = (),
    files: bool = False,
    params: tuple[str, ...] = (),
    check: Callable[[dict[str, Any]], None] | None = None,
) -> Callable[[F], F]:
    """Declare, on the stage function itself, what it reads (`register_stage` takes it up)."""

    def mark(function: F) -> F:
        reads = Accepts(tuple(needs), tuple(may), files, tuple(params), check)
        setattr(function, ACCEPTS_ATTR, reads)
        return function

    return mark


def declared(function: Callable[..., Any]) -> Accepts | None:
    """What `function` declares it reads; None: not declared (nothing is checked)."""
    found = getattr(function, ACCEPTS_ATTR, None)
    return found if isinstance(found, Accepts) else None
