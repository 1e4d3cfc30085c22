"""`tibnlp predict`: batch inference with a fine-tuned classifier directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.markup import escape

from tibnlp.cli.common import console
from tibnlp.evaluation.predict import predict_file


def predict(
    model: Annotated[Path, typer.Option(help="Fine-tuned classifier directory.")],
    input: Annotated[
        str, typer.Option("--input", "-i", help="JSONL (see --text-field) or text; -.")
    ],
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="JSONL output (default, or -: stdout)."),
    ] = None,
    batch_size: Annotated[int, typer.Option(min=1, help="Texts per forward pass.")] = 128,
    device: Annotated[
        Literal["auto", "cpu", "cuda"],
        typer.Option(help="auto: the GPU when one is visible (as fine-tuning), else the CPU."),
    ] = "auto",
    text_field: Annotated[
        str | None,
        typer.Option(
            help="JSONL field of the text (default: the classifier's dataset's, or text)."
        ),
    ] = None,
    label_field: Annotated[
        str | None,
        typer.Option(help="JSONL field of a gold label (default: as --text-field, or label)."),
    ] = None,
) -> None:
    """One JSON line per input: the input record plus `prediction` and `probabilities`."""
    if output is not None and str(output) == "-":  # as --input takes it: stdout, no file "-"
        output = None
    done = predict_file(model, input, output, batch_size, device, text_field, label_field)
    meta = done.meta
    console.print(
        escape(
            f"predicted {done.count} text(s) with {model} ({meta.dataset}; input form "
            f"{meta.text_form}; on {done.device})" + (f" -> {output}" if output else "")
        )
    )
    if done.cut_texts:  # as fine-tuning says it: the text the classifier did not read
        console.print(
            "[yellow]warning:[/] "
            + escape(
                f"{done.cut_texts} of {done.count} text(s) of {done.source} are longer than "
                f"the classifier's read length ({done.read_length} tokens); "
                f"{done.cut_tokens} tokens were cut off and not read: their predictions are "
                "of the beginning of the text only"
            )
        )
    if not done.count:
        console.print(
            f"[yellow]warning:[/] {escape(done.source)} holds no text (blank lines are skipped), "
            "so nothing was predicted"
        )
    _warn_lines(
        done.blank_lines,
        done.source,
        "have no text the classifier reads, blank or only punctuation and marks",
        "their predictions read no text",
    )
    _warn_lines(
        done.unknown_lines,
        done.source,
        "hold no piece the classifier's vocabulary knows, only [UNK]",
        "not Tibetan text? their predictions read nothing of it",
    )
    if done.foreign_labels:
        shown = ", ".join(repr(x) for x in done.foreign_labels[:5])
        more = f" and {len(done.foreign_labels) - 5} more" if len(done.foreign_labels) > 5 else ""
        console.print(
            "[yellow]warning:[/] "
            + escape(
                f"records of {done.source} carry labels that are none of the classifier's "
                f"classes ({shown}{more}; it predicts {', '.join(meta.labels)}): texts of "
                f"another dataset than {meta.dataset}, or the wrong classifier?"
            )
        )


def _warn_lines(lines: list[int], source: str, what: str, meaning: str) -> None:
    """A warning naming the input lines (the first ten) whose records are `what`."""
    if not lines:
        return
    shown = ", ".join(map(str, lines[:10]))
    more = f" and {len(lines) - 10} more" if len(lines) > 10 else ""
    console.print(
        f"[yellow]warning:[/] {len(lines)} record(s) of {escape(source)} "
        + escape(f"{what} (line {shown}{more}): {meaning}")
    )
