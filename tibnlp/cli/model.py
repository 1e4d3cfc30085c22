"""`tibnlp model ...`: inspect what a model config builds, and a model's global memory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tibnlp.cli.common import ConfigOption, SetOption, resolve_config
from tibnlp.models.io import load_config_file
from tibnlp.models.memory_report import inspect_memory
from tibnlp.models.summary import describe as summarise

app = typer.Typer(help="Inspect model configurations.", no_args_is_help=True)


@app.command()
def describe(config: ConfigOption = None, set_: SetOption = None) -> None:
    """Head distribution (layers x scales, per head count) and parameter counts."""
    full = resolve_config(config, set_)
    cfg = full.model
    s = summarise(cfg, full.pretrain)
    out = Console()
    h = cfg.heads
    routing = (
        f"dynamic heads {h.small}/{h.large}, rule {h.rule}, threshold {h.threshold}"
        if h.dynamic
        else f"fixed heads {h.small}"
    )
    out.print(f"[bold]core[/] {s.core}; {routing}")
    for heads, dist in s.distributions.items():
        title = f"heads per scale, h={heads}" + (
            f", alpha={cfg.scales.alpha}" if cfg.scales.enabled else ""
        )
        table = Table(title=title)
        table.add_column("layer", justify="right")
        for scale in s.scales:
            table.add_column(scale, justify="right")
        for i, counts in enumerate(dist, start=1):
            table.add_row(str(i), *(str(c) for c in counts))
        out.print(table)
    params = Table(title="parameters")
    params.add_column("part")
    params.add_column("count", justify="right")
    for name, n in s.parameters.items():
        params.add_row(name, f"{n:,}")
    out.print(params)


@app.command()
def memory(
    model: Annotated[Path, typer.Option("--model", help="Pretraining model directory.")],
    text: Annotated[
        Path, typer.Option("--text", dir_okay=False, help="UTF-8 text file: one document.")
    ],
    threshold: Annotated[
        float | None,
        typer.Option(help="Entropy bound in nats, > 0 (finetune.global_memory.threshold)."),
    ] = None,
    budget: Annotated[
        int | None, typer.Option(min=1, help="Most tokens kept (finetune.global_memory.budget).")
    ] = None,
    segment_len: Annotated[
        int | None,
        typer.Option(
            min=2, help="Tokens per segment of the first pass, 2 to model.max_len (the default)."
        ),
    ] = None,
) -> None:
    """GEMFormer's global memory of one document: the tokens whose MLM entropy is low."""
    # checked here, not deep in the encoder: a bad value would otherwise keep nothing and
    # exit 0 (a threshold <= 0) or end in a ValueError traceback (a segment over max_len)
    if threshold is not None and not threshold > 0:
        raise typer.BadParameter(f"{threshold} is not > 0 nats", param_hint="--threshold")
    if segment_len is not None:
        max_len = load_config_file(model).max_len
        if segment_len > max_len:
            raise typer.BadParameter(
                f"{segment_len} is more than the model's max_len {max_len} ({model}/model.yaml)",
                param_hint="--segment-len",
            )
    r = inspect_memory(model, text, threshold, budget, segment_len)
    out = Console()
    out.print(
        f"[bold]memory[/] {len(r.kept)} of {r.tokens} tokens ({r.share:.1%}); entropy < "
        f"{r.threshold} nats, budget {r.budget}, segments of {r.segment_len}; "
        f"mean entropy {r.mean_entropy:.3f}"
    )
    table = Table(title="kept tokens (document order)")
    table.add_column("position", justify="right")
    table.add_column("piece")
    table.add_column("entropy", justify="right")
    for k in r.kept:
        table.add_row(str(k.position), escape(k.piece), f"{k.entropy:.3f}")
    out.print(table)
    out.print(f"[bold]memory text[/] {escape(r.memory_text)}")  # the text, not markup
