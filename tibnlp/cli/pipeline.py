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
        if result.run_id:
            logged = f", run {result.run_id}"
        elif result.ran:  # stages ran and no parent run was made: tracking.enabled is false
            logged = " (tracking off: nothing logged)"
        else:
            logged = " (every stage cached: no new run)"
        console.print(
            f"done: {len(result.ran)} ran, {len(result.skipped)} cached; "
            f"MLflow experiment {spec.experiment!r}{logged}"
        )
        for name, out in result.outputs.items():
            typer.echo(f"{name}\t{out}")


@app.command("clean")
def clean(
    file: Annotated[Path, typer.Argument(help="Pipeline YAML whose work dir to clean.")],
    overrides: SetOption = None,
    workdir: Annotated[
        Path | None, typer.Option(help="The work dir (default from the file).")
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", help="Remove them (without: list only).")] = False,
) -> None:
    """List the stage outputs the file's current plan does not use; --yes removes them.

    They are outputs of other settings and of interrupted runs. Give the same --set as the
    runs to keep."""
    from tibnlp.folder_lock import hold_folder
    from tibnlp.pipeline.clean import remove, unused_outputs
    from tibnlp.pipeline.planner import Planner

    planner = Planner(load_pipeline(file, overrides or []), workdir)
    if not planner.workdir.is_dir():
        console.print(f"{planner.workdir}: no work dir yet, nothing to clean")
        return
    with hold_folder(planner.workdir):  # not while a run plans or publishes in it
        unused = unused_outputs(planner)
        for item in unused:
            typer.echo(f"{_mib(item.bytes):>10}  {item.path}  ({item.why})")
        total = _mib(sum(item.bytes for item in unused))
        if not unused:
            console.print(f"{planner.workdir}: every stage output is in the current plan")
        elif yes:
            remove(unused)
            console.print(f"removed {len(unused)} folder(s), {total}")
        else:
            console.print(
                f"{len(unused)} folder(s), {total}, are not in the plan of {file} with these "
                "settings; run again with --yes to remove them (give the --set the runs you "
                "keep used: other settings plan other outputs)"
            )


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


@app.command("exec-stage", hidden=True)
def exec_stage_command(
    context: Annotated[Path, typer.Argument(help="Stage context written by `pipeline run`.")],
) -> None:
    """Run one stage inside a launcher's process (used by stages with `launch:`)."""
    exec_stage(context)
