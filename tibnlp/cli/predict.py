"""`tibnlp predict`: batch inference with a fine-tuned classifier directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tibnlp.cli.common import console
from tibnlp.evaluation.predict import predict_file


def predict(
    model: Annotated[Path, typer.Option(help="Fine-tuned classifier directory.")],
    input: Annotated[str, typer.Option("--input", "-i", help="JSONL (text field) or text; -.")],
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="JSONL output (default stdout).")
    ] = None,
    batch_size: Annotated[int, typer.Option(min=1, help="Texts per forward pass.")] = 128,
) -> None:
    """One JSON line per input: the input record plus `prediction` and `probabilities`."""
    count, meta = predict_file(model, input, output, batch_size)
    console.print(
        f"predicted {count} text(s) with {model} ({meta.dataset}; input form {meta.text_form})"
        + (f" -> {output}" if output else "")
    )
