"""Run one stage under a multi-process launcher (torchrun, deepspeed) from a pipeline.

The pipeline process stays single: it writes the stage's context to a JSON file in the
stage's partial directory and runs `LAUNCH tibnlp.cli.main pipeline exec-stage FILE`, where
`LAUNCH` ends with the launcher's module flag (`torchrun --nproc_per_node 8 -m`,
`deepspeed --num_gpus 8 --module`). Every process runs the stage function; rank 0 logs to the
stage's MLflow run and writes the result back for the pipeline to publish.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

from tibnlp.config import Config, from_dict, to_dict
from tibnlp.errors import TibnlpError
from tibnlp.pipeline.context import StageContext
from tibnlp.pipeline.registry import stage_def
from tibnlp.tracking import Tracker

CONTEXT_FILE = ".tibnlp-launch.json"
RESULT_FILE = ".tibnlp-launch-result.json"


def launch_stage(launch: str, kind: str, ctx: StageContext) -> Any:
    """Run the stage in the launcher's processes; returns what rank 0's stage function did."""
    ctx_file = ctx.output / CONTEXT_FILE
    result_file = ctx.output / RESULT_FILE
    result_file.unlink(missing_ok=True)
    inputs: Any = (
        {k: str(v) for k, v in ctx.inputs.items()}
        if isinstance(ctx.inputs, dict)
        else [str(v) for v in ctx.inputs]
    )
    data = {
        "kind": kind,
        "name": ctx.name,
        "stage": ctx.stage,
        "variant": ctx.variant,
        "config": to_dict(ctx.config),
        "inputs": inputs,
        "output": str(ctx.output.resolve()),
        "resume": ctx.resume,
        "params": ctx.params,
    }
    ctx_file.write_text(json.dumps(data, ensure_ascii=False, default=str), encoding="utf-8")
    cmd = [*shlex.split(launch), "tibnlp.cli.main", "pipeline", "exec-stage", str(ctx_file)]
    try:
        proc = subprocess.run(cmd, check=False)
    except OSError as exc:  # no such launcher, or not executable: a misspelt `launch:`
        raise TibnlpError(
            f"stage {ctx.name}: its `launch: {launch}` cannot start: {exc.strerror} ({cmd[0]})",
            "name a launcher on PATH (e.g. `torchrun --nproc_per_node 2 -m`) or give its full "
            "path in the stage's `launch` key",
        ) from None
    if proc.returncode != 0 or not result_file.is_file():
        raise TibnlpError(
            f"stage {ctx.name} failed under `{launch}` (exit code {proc.returncode})",
            "its output so far is kept; fix the cause and run the pipeline again to resume",
        )
    result = json.loads(result_file.read_text(encoding="utf-8"))
    result_file.unlink()
    ctx_file.unlink()
    path = Path(result["path"]) if result.get("path") else None
    report = result.get("report")
    if path is not None and report is not None:
        return path, report
    return path if path is not None else report


def exec_stage(ctx_file: Path) -> None:
    """The launched side: rebuild the context, run the stage, rank 0 reports back."""
    data = json.loads(Path(ctx_file).read_text(encoding="utf-8"))
    cfg = from_dict(Config, data["config"])
    rank = int(os.environ.get("RANK", "0"))
    track = cfg.tracking
    tracker = Tracker(
        track.experiment,
        uri=track.uri,
        enabled=track.enabled and rank == 0 and bool(track.run_id),
        resume_run_id=track.run_id or None,
        buffer_dir=track.buffer_dir or None,
        retry_seconds=track.retry_seconds,
    )
    inputs = data["inputs"]
    ctx = StageContext(
        data["name"],
        data["stage"],
        data["variant"],
        cfg,
        {k: Path(v) for k, v in inputs.items()}
        if isinstance(inputs, dict)
        else [Path(v) for v in inputs],
        Path(data["output"]),
        bool(data["resume"]),
        tracker,
        data.get("params") or {},
    )
    value = stage_def(data["kind"]).load()(ctx)
    tracker.end()  # the pipeline sets the run's final status
    if rank != 0:
        return
    path, report = None, None
    if isinstance(value, tuple):
        value, report = value
    if isinstance(value, (str, Path)):
        path = str(value)
    elif isinstance(value, dict):
        report = value
    out = Path(data["output"]) / RESULT_FILE
    out.write_text(
        json.dumps({"path": path, "report": report}, ensure_ascii=False, default=str),
        encoding="utf-8",
    )
