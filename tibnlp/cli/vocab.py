"""`tibnlp vocab`: build the SentencePiece unigram vocabulary from a prepared corpus."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from tibnlp.cli.common import ConfigOption, SetOption, console, resolve_config
from tibnlp.text.vocab_build import build_vocabulary

app = typer.Typer(help="SentencePiece unigram vocabulary.", no_args_is_help=True)


@app.command("build")
def build(
    corpus: Annotated[Path, typer.Option(help="Prepared corpus folder (`tibnlp corpus prepare`).")],
    output: Annotated[Path, typer.Option(help="New folder for the vocabulary.")],
    vocab_size: Annotated[
        int | None, typer.Option(help="Pieces (default: vocab.vocab_size).")
    ] = None,
    config: ConfigOption = None,
    overrides: SetOption = None,
) -> None:
    """Train the vocabulary on the train split and report it on the held-out split."""
    extra = [f"vocab.vocab_size={vocab_size}"] if vocab_size is not None else []
    cfg = resolve_config(config, overrides, *extra)
    with console.status("training SentencePiece unigram model..."):
        report = build_vocabulary(corpus, output, cfg.vocab)
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
    if report["vocab_size"] < report["requested_vocab_size"]:
        console.print(
            f"[yellow]note:[/] the corpus supports {report['vocab_size']} pieces, fewer than the "
            f"{report['requested_vocab_size']} asked (vocab.hard_limit=true makes this an error)"
        )
