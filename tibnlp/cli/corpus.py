"""`tibnlp corpus`: prepare raw Tibetan text for the vocabulary and pretraining."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Group
from rich.table import Table

from tibnlp.cli.common import ConfigOption, SetOption, console, resolve_config
from tibnlp.text.prepare import prepare_corpus

app = typer.Typer(
    help="Corpus preparation (normalise, split, filter, dedup).", no_args_is_help=True
)


@app.command("prepare")
def prepare(
    input: Annotated[
        list[Path],
        typer.Option(
            "--input", "-i", help="Text (.txt, .xz, .gz, .bz2), JSONL or a folder (repeatable)."
        ),
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="Prepared corpus directory.")],
    field: Annotated[
        str | None, typer.Option(help="JSONL field with the text [corpus.field].")
    ] = None,
    on_error: Annotated[
        str | None,
        typer.Option(
            help="fail | skip: stop at a bad line, or count and skip it [corpus.on_error]."
        ),
    ] = None,
    num_proc: Annotated[
        int | None, typer.Option(help="Worker processes (0 = all cores) [corpus.num_proc].")
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace OUTPUT if it is a previous prepared corpus.")
    ] = False,
    progress: Annotated[bool, typer.Option(help="Show progress bars.")] = True,
    config: ConfigOption = None,
    set_: SetOption = None,
) -> None:
    """Prepare a corpus: OUTPUT/dataset (train/heldout, one row per document), report.json."""
    extra = [
        f"corpus.{key}={value}"
        for key, value in (("field", field), ("on_error", on_error), ("num_proc", num_proc))
        if value is not None
    ]
    cfg = resolve_config(config, set_, *extra).corpus
    report = prepare_corpus(input, output, cfg, progress=progress, force=force)
    console.print(report_table(report))
    console.print(f"prepared corpus written to {output} ({report['seconds']} s)")


def report_table(report: dict[str, Any]) -> Group:
    """The report's figures per split and in total, then what was dropped and why."""
    columns = ("documents", "sentences", "syllables", "characters")
    figures = Table(title="prepared corpus")
    figures.add_column("split")
    for name in columns:
        figures.add_column(name, justify="right")
    for name, fig in [*report["splits"].items(), ("total", report["total"])]:
        figures.add_row(name, *(f"{fig[k]:,}" for k in columns))
    dropped = Table(title="dropped")
    for name in ("unit", "reason", "count"):
        dropped.add_column(name, justify="right" if name == "count" else "left")
    for unit in ("lines", "sentences", "documents"):
        for reason, n in report[f"dropped_{unit}"].items():
            dropped.add_row(unit, reason, f"{n:,}")
    return Group(figures, dropped)
