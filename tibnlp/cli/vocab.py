"""`tibnlp vocab`: build the SentencePiece unigram vocabulary from a prepared corpus."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from tibnlp.cli.common import ConfigOption, SetOption, console, resolve_config
from tibnlp.text.vocab_build import build_vocabulary

app = typer.Typer(help="SentencePiece unigram vocabulary.", no_args_is_help=True)

# build_vocabulary's stages: what the bar says, and the unit counted (None: no count)
STAGES = {
    "units": ("counting units", "sentences"),
    "reading": ("reading sentences", "sentences"),
    "seeding": ("finding seed pieces", None),
    "training": ("training (EM)", "rounds"),
    "evaluating": ("evaluating", None),
}


class _Count(ProgressColumn):
    """done/total and the rate, in the stage's unit."""

    def render(self, task: Task) -> Text:
        unit = task.fields.get("unit")
        if not unit:
            return Text("")
        total = f"/{task.total:,.0f}" if task.total is not None else ""
        rate = f", {task.speed:,.0f}/s" if task.speed and task.speed >= 1 else ""
        return Text(f"{task.completed:,.0f}{total} {unit}{rate}")


class BuildProgress:
    """One bar per stage of `build_vocabulary`, with rate and ETA; where stderr is no
    terminal (a log), plain lines instead: a stage's start, every 30 s, and its end."""

    def __init__(self) -> None:
        self.bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(bar_width=24),
            _Count(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            disable=not console.is_terminal,
        )
        self.last_line = 0.0

    def __enter__(self) -> BuildProgress:
        self.bar.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is None:
            self._end_stage()
        self.bar.stop()

    def __call__(self, stage: str, done: int, total: int | None) -> None:
        what, unit = STAGES.get(stage, (stage, None))
        new = not self.bar.tasks or self.bar.tasks[-1].fields["stage"] != stage
        if new:
            self._end_stage()
            self.bar.add_task(what, total=total, unit=unit, stage=stage, ended=False)
        self.bar.update(self.bar.tasks[-1].id, completed=done, total=total)
        self._plain_line(force=new)

    def _end_stage(self) -> None:
        """The stage before the next (or the last one) is done: its bar shows full."""
        if self.bar.tasks and not self.bar.tasks[-1].fields["ended"]:
            task = self.bar.tasks[-1]
            end = task.total if task.total is not None else max(task.completed, 1)
            self.bar.update(task.id, total=end, completed=end, ended=True)
            self._plain_line(force=True, ended=True)

    def _plain_line(self, force: bool, ended: bool = False) -> None:
        """Logs have no live bar: the stage, its count and rate, and the ETA or time taken."""
        now = time.monotonic()
        if console.is_terminal or (not force and now - self.last_line < 30.0):
            return
        self.last_line = now
        task = self.bar.tasks[-1]
        count = _Count().render(task).plain
        if ended:
            when = f" in {task.finished_time or task.elapsed or 0:.0f} s"
        else:
            eta = task.time_remaining if task.total is not None else None
            when = f", ETA {eta / 60:.1f} min" if eta is not None and task.completed else ""
        console.print(
            f"vocab: {task.description}{' done' if ended else ''}"
            f"{': ' + count if count and task.completed else ''}{when}",
            soft_wrap=True,
        )


@app.command("build")
def build(
    corpus: Annotated[Path, typer.Option(help="Prepared corpus folder (`tibnlp corpus prepare`).")],
    output: Annotated[Path, typer.Option(help="New folder for the vocabulary.")],
    vocab_size: Annotated[
        int | None, typer.Option(help="Pieces (default: vocab.vocab_size).")
    ] = None,
    config: ConfigOption = None,
    overrides: SetOption = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace OUTPUT if it is a previous vocabulary.")
    ] = False,
) -> None:
    """Train the vocabulary on the train split and report it on the held-out split."""
    extra = [f"vocab.vocab_size={vocab_size}"] if vocab_size is not None else []
    cfg = resolve_config(config, overrides, *extra)
    with BuildProgress() as progress:
        report = build_vocabulary(corpus, output, cfg.vocab, progress=progress, force=force)
    # paths and pieces are text, not rich markup: a `[x]` in them would vanish
    table = Table(title=f"vocabulary {escape(str(output))}")
    table.add_column("figure")
    table.add_column("value", overflow="fold")
    for key in (
        "vocab_size",
        "split_on_tsheg",
        "punctuation_pieces",
        "whole_units",
        "cross_syllables",
        "multi_syllable_pieces",
        "unk_share",
        "pieces_per_syllable",
        "syllable_type_coverage",
        "syllable_type_single_piece",
        "syllable_token_single_piece",
        "syllable_types",
        "heldout_syllables",
    ):
        value = report[key]
        table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    table.add_row("20 longest pieces", escape(" ".join(report["longest_pieces"])))
    console.print(table)
    if not report["heldout_sentences"]:
        console.print(
            f"[yellow]warning:[/] {escape(str(corpus))} has no held-out documents, so the "
            "held-out figures above are 0 and say nothing of the vocabulary (prepare the "
            "corpus with corpus.heldout_fraction > 0 and blank lines between .txt documents "
            "to measure it)"
        )
    if report.get("too_long_sentences"):
        console.print(
            f"[yellow]warning:[/] SentencePiece skipped {report['too_long_sentences']:,} train "
            f"sentence(s) longer than vocab.max_sentence_length={cfg.vocab.max_sentence_length} "
            f"bytes (the longest: {report['longest_sentence_bytes']:,}); their text is not in "
            "the vocabulary (raise vocab.max_sentence_length to learn from them)"
        )
    if report["vocab_size"] < report["requested_vocab_size"]:
        console.print(
            f"[yellow]note:[/] the corpus supports {report['vocab_size']} pieces, fewer than the "
            f"{report['requested_vocab_size']} asked (vocab.hard_limit=true makes this an error)"
        )
