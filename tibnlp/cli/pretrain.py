"""`tibnlp pretrain`: ALBERT MLM + SOP pretraining on DeepSpeed (one process or a launcher's)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from tibnlp.cli.common import ConfigOption, SetOption, console, resolve_config
from tibnlp.stopping import exit_status


def pretrain(
    config: ConfigOption = None,
    overrides: SetOption = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the newest complete checkpoint.")
    ] = False,
    time_budget: Annotated[
        str | None,
        typer.Option("--time-budget", help='Stop after this wall-clock time: "2h", "30m", "90s".'),
    ] = None,
    wait: Annotated[
        bool,
        typer.Option("--wait", help="If another run holds the output folder, wait for it."),
    ] = False,
    eval_only: Annotated[
        bool,
        typer.Option(
            "--eval-only",
            help="Score pretrain.init_from on the corpus's held-out split (MLM accuracy and "
            "loss, fixed masks) without training; writes OUTPUT/eval.json.",
        ),
    ] = False,
) -> None:
    """Pretrain the encoder (MLM + SOP) on DeepSpeed; one process by default.

    Several processes: `torchrun --nproc_per_node N -m tibnlp.cli.main pretrain ...`, or
    `deepspeed --num_gpus N --no_local_rank --module tibnlp.cli.main pretrain ...`; several
    nodes: the same with `deepspeed --hostfile FILE` (one line per node: `host slots=N`).
    """
    from tibnlp.training.pretrain import run_pretraining

    extra = [f"pretrain.time_budget={time_budget}"] if time_budget is not None else []
    cfg = resolve_config(config, overrides, *extra)
    try:
        out = run_pretraining(cfg, resume=resume, wait=wait, eval_only=eval_only)
    except KeyboardInterrupt as stop:  # the checkpoints written so far stay: say how to go on
        if os.environ.get("RANK", "0") == "0" and not eval_only:
            console.print(_interrupted(Path(cfg.pretrain.output) / "checkpoints"))
        raise SystemExit(exit_status(stop)) from None
    if os.environ.get("RANK", "0") == "0":  # once per run, not once per process
        console.print(f"{'scores' if eval_only else 'model'}: {out}")


def _interrupted(checkpoints: Path) -> str:
    """What an interrupted run leaves: --resume only continues from a complete checkpoint; one
    stopped before its first said to --resume, which then refused (no complete checkpoint)."""
    from tibnlp.training.checkpoint import latest_tag

    tag = latest_tag(checkpoints)
    if tag is None:
        return (
            f"interrupted before the first checkpoint: no checkpoints in {checkpoints} stay, "
            "so there is nothing to continue with --resume; run the same command again "
            "without it to start over"
        )
    return (
        f"interrupted: the checkpoints in {checkpoints} stay (the newest: {tag}); "
        "run the same command with --resume to continue from the newest"
    )
