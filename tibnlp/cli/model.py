"""`tibnlp model ...`: inspect what a model config builds."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from tibnlp.cli.common import ConfigOption, SetOption, resolve_config
from tibnlp.models.summary import describe as summarise

app = typer.Typer(help="Inspect model configurations.", no_args_is_help=True)


@app.command()
def describe(config: ConfigOption = None, set_: SetOption = None) -> None:
    """Head distribution (layers x scales, per head count) and parameter counts."""
    cfg = resolve_config(config, set_).model
    s = summarise(cfg)
    out = Console()
    h = cfg.heads
    routing = (
        f"dynamic heads {h.small}/{h.large}, rule {h.rule}, threshold {h.threshold}"
        if h.dynamic
        else f"fixed heads {h.small}"
    )
    out.print(f"[bold]core[/] {s.core}; {routing}; pooling {cfg.pooling}")
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
