"""Options shared by every command: `--config FILE` and repeated `--set section.key=value`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from tibnlp.config import Config, load_config

console = Console(stderr=True)


def table_console(stdout: bool) -> Console:
    """Where a results table goes: stdout where it is what the command makes (`> table.txt`),
    stderr beside a training's log. Logs and pipes get 220 columns, not rich's 80: too narrow
    for a dozen metric columns."""
    out = Console(stderr=not stdout)
    return out if out.is_terminal else Console(stderr=not stdout, width=220)


ConfigOption = Annotated[
    Path | None, typer.Option("--config", "-c", help="YAML file with config sections.")
]
SetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        "-s",
        help="Override a config key: section.key=value (repeatable). A key with dots of its "
        "own is written in full: tracking.tags.team.name=nlp sets the tag 'team.name', "
        "stages.finetune.grid.finetune.head=\\[cnn] a pipeline grid's 'finetune.head'; "
        "stages.pretrain.variants.fixed12.set.model.heads.small=8 a key of the pipeline "
        "variant fixed12 (a variant by name, or by position from 0).",
    ),
]


def resolve_config(config: Path | None, overrides: list[str] | None, *extra: str) -> Config:
    """Defaults <- file <- command-specific flags (as overrides) <- `--set` values."""
    return load_config(config, [*extra, *(overrides or [])])
