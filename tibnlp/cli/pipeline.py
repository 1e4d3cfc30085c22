"""`tibnlp pipeline`: run the stages of a pipeline file, skipping what is already built."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tibnlp.cli.common import SetOption, console
from tibnlp.pipeline.launch import exec_stage
from tibnlp.pipeline.runner import run_pipeline
from tibnlp.pipeline.spec import load_pipeline

app = typer.Typer(
    help="Chain stages from a pipeline YAML, cached by content.", no_args_is_help=True
)


@app.command("run")
def run(
    file: Annotated[Path, typer.Argument(help="Pipeline YAML (see pipelines/).")],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan (run/skip and why) only.")
    ] = False,
    overrides: SetOption = None,
    force: Annotated[
        list[str] | None,
        typer.Option("--force", help="Rerun this stage even if cached, and what reads it."),
    ] = None,
    workdir: Annotated[
        Path | None, typer.Option(help="Where stage outputs live (default from the file).")
    ] = None,
    tracking_uri: Annotated[
        str, typer.Option("--tracking-uri", help="MLflow store or server URI.")
    ] = "",
    wait: Annotated[
        bool,
        typer.Option("--wait", help="If another run holds the work dir, wait for it to finish."),
    ] = False,
    until: Annotated[
        list[str] | None,
        typer.Option(
            "--until",
            help="Run only this stage and the stages it reads (repeatable); leave the rest.",
        ),
    ] = None,
) -> None:
    """Run a pipeline; a stage whose config and inputs are unchanged is skipped."""
    spec = load_pipeline(file, overrides or [])
    result = run_pipeline(
        spec,
        dry_run=dry_run,
        force=force or [],
        tracking_uri=tracking_uri,
        echo=lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True),
        workdir=workdir,
        wait=wait,
        until=until or [],
    )
    if not dry_run:
        console.print(
            f"done: {len(result.ran)} ran, {len(result.skipped)} cached; "
            f"MLflow experiment {spec.experiment!r}"
            + (f", run {result.run_id}" if result.run_id else " (every stage cached: no new run)")
        )
        for name, out in result.outputs.items():
            typer.echo(f"{name}\t{out}")


@app.command("exec-stage", hidden=True)
def exec_stage_command(
    context: Annotated[Path, typer.Argument(help="Stage context written by `pipeline run`.")],
) -> None:
    """Run one stage inside a launcher's process (used by stages with `launch:`)."""
    exec_stage(context)
