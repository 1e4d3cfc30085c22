"""`tibnlp export ...`: a model directory in another ecosystem's format."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from tibnlp.cli.common import console

app = typer.Typer(help="Export models for other toolkits.", no_args_is_help=True)


@app.command()
def hf(
    model: Annotated[
        Path, typer.Option("--model", help="Pretraining model directory (OUTPUT/model).")
    ],
    output: Annotated[Path, typer.Option("--output", help="New Hugging Face directory.")],
) -> None:
    """ALBERT for transformers (AutoModel, AutoModelForMaskedLM) with a Tibetan-safe tokenizer."""
    from tibnlp.export.hf_model import export_hf

    out = export_hf(model, output)
    console.print(
        f"wrote {escape(str(out))}: load it with transformers.AutoModelForMaskedLM.from_pretrained"
    )
