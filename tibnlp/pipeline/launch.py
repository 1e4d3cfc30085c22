"""Run one stage under a multi-process launcher (torchrun, deepspeed) from a pipeline.

The pipeline process stays single: it writes the stage's context to a JSON file in the
stage's partial directory and runs `LAUNCH tibnlp.cli.main pipeline exec-stage FILE`, where
`LAUNCH` ends with the launcher's module flag (`torchrun --nproc_per_node 8 -m`,
`deepspeed --num_gpus 8 --module`). Every process runs the stage function; rank 0 logs to the
stage's MLflow run and writes the result back for the pipeline to publish. A kind a plugin
registered is found there by importing the module that defines its function.

No launched process outlives the pipeline: a pipeline stopped by Ctrl-C or a signal stops
the launcher (which stops its workers), one killed outright takes the launcher with it
(`tibnlp.stopping.die_with_parent`), and a worker whose launcher is gone stops itself
(`stop_when_orphaned`). Left running, they went on writing into the stage's partial output
while the next run of the pipeline started the stage again there.
"""

from __future__ import annotations

import importlib
import json
import os
import shlex
import signal
import subprocess
from pathlib import Path
from typing import Any

from tibnlp.config import Config, from_dict, to_dict
from tibnlp.errors import ConfigError, TibnlpError
from tibnlp.folder_lock import this_process
from tibnlp.pipeline.context import StageContext
from tibnlp.pipeline.registry import stage_def
from tibnlp.stopping import die_with_parent, stop_when_orphaned
from tibnlp.tracking import Tracker

CONTEXT_FILE = ".tibnlp-launch.json"
RESULT_FILE = ".tibnlp-launch-result.json"
# after a stop: how long the launcher may take to stop its workers after our SIGTERM
# (torchrun gives them 30 s), before SIGKILL
STOP_GRACE_S = 60.0


def check_launch(launch: str, at: str) -> None:
    """Checked as the pipeline file loads: a launcher is run as `LAUNCH tibnlp.cli.main ...`,
    so it must end with its module flag; without it torchrun looks for a script file named
    tibnlp.cli.main and fails in the stage, after the stages above it have run. An unbalanced
    quote fails the split the same way."""
    if not launch:
        return
    try:
        words = shlex.split(launch)
    except ValueError as exc:
        raise ConfigError(f"{at}: {launch!r} cannot be split into words ({exc})") from None
    if not words or words[-1] not in ("-m", "--module"):
        raise ConfigError(
            f"{at}: {launch!r} must end with the launcher's module flag, as in "
            "'torchrun --nproc_per_node 8 -m' or 'deepspeed --num_gpus 8 --module' "
            "(the pipeline appends the module tibnlp.cli.main)"
        )


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
    function = stage_def(kind).load()
    module = getattr(function, "__module__", "") or ""
    if module == "__main__":
        raise TibnlpError(
            f"stage {ctx.name}: kind {kind!r} is registered by the script that runs the "
            "pipeline, which the launched processes cannot import",
            "move the stage function and its register_stage call into a module they can "
            "import (on PYTHONPATH)",
        )
    data = {
        "kind": kind,
        "module": module,
        "name": ctx.name,
        "stage": ctx.stage,
        "variant": ctx.variant,
        "config": to_dict(ctx.config),
        "inputs": inputs,
        "output": str(ctx.output.resolve()),
        "resume": ctx.resume,
        "params": ctx.params,
        # whose stage it is: a worker whose launcher died before it could note its parent
        # still sees the pipeline go
        "pipeline": this_process(),
    }
    ctx_file.write_text(json.dumps(data, ensure_ascii=False, default=str), encoding="utf-8")
    cmd = [*shlex.split(launch), "tibnlp.cli.main", "pipeline", "exec-stage", str(ctx_file)]
    try:
        code = _run_launcher(cmd)
    except OSError as exc:  # no such launcher, or not executable: a misspelt `launch:`
        raise TibnlpError(
            f"stage {ctx.name}: its `launch: {launch}` cannot start: {exc.strerror} ({cmd[0]})",
            "name a launcher on PATH (e.g. `torchrun --nproc_per_node 2 -m`) or give its full "
            "path in the stage's `launch` key",
        ) from None
    if code != 0 or not result_file.is_file():
        raise TibnlpError(
            f"stage {ctx.name} failed under `{launch}` (exit code {code})",
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


def pipeline_to_watch(pipeline: dict[str, Any]) -> tuple[int, int | None] | None:
    """The pipeline's (pid, start time) when this process can see it: same host and pid
    namespace (a rank on another node must not take a pid there for the pipeline's)."""
    here = this_process()
    if not pipeline or any(pipeline.get(k) != here[k] for k in ("host", "pid_ns")):
        return None
    return int(pipeline["pid"]), pipeline.get("start")


def _run_launcher(cmd: list[str]) -> int:
    """Run the launcher to its end; its exit code. Stopped (Ctrl-C, SIGTERM, an error here),
    it is told to stop its workers, then killed after STOP_GRACE_S. It runs in a session of
    its own, so this process alone signals it, and once: a Ctrl-C at the terminal or a
    signal to the pipeline's group reached it too, and the second signal cut torchrun's own
    shutdown short (leaving its workers orphaned)."""
    proc = subprocess.Popen(cmd, preexec_fn=die_with_parent(), start_new_session=True)
    try:
        return proc.wait()
    except BaseException:
        _stop_launcher(proc)
        raise


def _stop_launcher(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # torchrun and deepspeed pass it to their workers
    try:
        proc.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()  # (its workers then stop themselves: stop_when_orphaned)
        proc.wait()


def exec_stage(ctx_file: Path) -> None:
    """The launched side: rebuild the context, run the stage, rank 0 reports back."""
    data = json.loads(Path(ctx_file).read_text(encoding="utf-8"))
    # the launcher killed with the pipeline (or the pipeline gone): stop, do not train on
    stop_when_orphaned(pipeline_to_watch(data.get("pipeline") or {}))
    if data.get("module"):  # a plugin's kind registers itself when its module is imported
        try:
            importlib.import_module(data["module"])
        except ImportError as exc:
            raise TibnlpError(
                f"stage {data['name']}: the launched process cannot import {data['module']}, "
                f"which registers the kind {data['kind']!r} ({exc})",
                "put the module on PYTHONPATH for the launcher's processes",
            ) from None
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
