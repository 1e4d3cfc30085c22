"""`tibnlp corpus`: prepare raw Tibetan text for the vocabulary and pretraining."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Group
from rich.markup import escape
from rich.table import Table

from tibnlp.cli.common import ConfigOption, SetOption, console, resolve_config
from tibnlp.stopping import exit_status
from tibnlp.text.corpus_words import PARTIAL_DIR, finished_shards, segment_corpus
from tibnlp.text.prepare import prepare_corpus

app = typer.Typer(
    help="Corpus preparation (normalise, split, filter, dedup).", no_args_is_help=True
)


@app.command("prepare", context_settings={"allow_extra_args": True})
def prepare(
    ctx: typer.Context,
    output: Annotated[Path, typer.Option("--output", "-o", help="Prepared corpus directory.")],
    input: Annotated[
        list[Path] | None,
        typer.Option(
            "--input",
            "-i",
            help="Text (.txt, .xz, .gz, .bz2), JSONL or a folder (with its subfolders); "
            "several after one flag "
            "(--input a.txt b.txt.xz) or the flag repeated.",
        ),
    ] = None,
    field: Annotated[
        str | None, typer.Option(help="JSONL field with the text (default: corpus.field).")
    ] = None,
    on_error: Annotated[
        str | None,
        typer.Option(
            help="fail | skip: stop at a bad line, or count and skip it (default: corpus.on_error)."
        ),
    ] = None,
    num_proc: Annotated[
        int | None, typer.Option(help="Worker processes, 0 = all cores (default: corpus.num_proc).")
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace OUTPUT if it is a previous prepared corpus.")
    ] = False,
    progress: Annotated[bool, typer.Option(help="Show progress bars.")] = True,
    config: ConfigOption = None,
    set_: SetOption = None,
) -> None:
    """Prepare a corpus: OUTPUT/dataset (train/heldout, one row per document), report.json."""
    # click gives an option one value: the paths after the first are left as extra arguments
    inputs = [*(input or []), *(Path(a) for a in ctx.args)]
    if not inputs:
        raise typer.BadParameter("name at least one input file or folder", param_hint="--input")
    extra = [
        f"corpus.{key}={value}"
        for key, value in (("field", field), ("on_error", on_error), ("num_proc", num_proc))
        if value is not None
    ]
    cfg = resolve_config(config, set_, *extra).corpus
    report = prepare_corpus(inputs, output, cfg, progress=progress, force=force)
    console.print(report_table(report))
    console.print(f"prepared corpus written to {escape(str(output))} ({report['seconds']} s)")


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


@app.command("words")
def words(
    corpus: Annotated[Path, typer.Argument(help="Prepared corpus directory.")],
    num_proc: Annotated[
        int | None, typer.Option(help="Worker processes, 0 = all cores (default: corpus.num_proc).")
    ] = None,
    pack: Annotated[
        Path | None,
        typer.Option(help="botok dialect pack folder (default: botok/general in the data dir)."),
    ] = None,
    config: ConfigOption = None,
    set_: SetOption = None,
) -> None:
    """Find the botok words of a prepared corpus (CORPUS/words/), for whole-word masking.

    Offline, from the dialect pack; resumes after an interruption; kept when up to date."""
    extra = [f"corpus.num_proc={num_proc}"] if num_proc is not None else []
    cfg = resolve_config(config, set_, *extra).corpus
    try:
        meta = segment_corpus(corpus, cfg.num_proc, pack=pack)
    except KeyboardInterrupt as stop:  # the finished shards stay: say how to go on
        kept = finished_shards(corpus)
        console.print(
            f"interrupted: the {kept} finished shard(s) stay in "
            f"{escape(str(corpus / PARTIAL_DIR))}; run the same command again to resume from "
            "them (it segments only the rest)"
            if kept
            else "interrupted before any shard was finished: run the same command again",
            soft_wrap=True,
        )
        raise SystemExit(exit_status(stop)) from None
    where = escape(str(corpus / "words"))
    figures = f"{meta['words']:,} words over {meta['syllables']:,} syllables"
    if meta["kept"]:  # nothing was segmented now: no time or rate to report
        console.print(f"{where} is up to date, kept: {figures} (botok {meta['botok']})")
        return
    rate = meta["syllables"] / meta["wall_seconds"] if meta["wall_seconds"] else 0.0
    console.print(
        f"{figures} in {where} (segmented in {meta['wall_seconds']:.0f} s, "
        f"{rate:,.0f} syllables/s, "
        f"{meta['num_proc']} process(es); botok {meta['botok']})"
    )
