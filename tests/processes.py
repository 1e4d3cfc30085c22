"""Whether a process is still running, for the tests that stop a command and then look for
workers it left (a zombie, waiting for its parent to collect it, runs nothing)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.is_file() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


def gone(pid: int, within: float = 30.0) -> bool:
    """The process has ended, or does within `within` seconds."""
    deadline = time.monotonic() + within
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def stop_at_two_workers(
    script: str, args: list[str], marks: Path, sig: int, root: Path, within: float = 120.0
) -> tuple[int | None, str, list[int]]:
    """Run `python -c script *args` in a process group of its own (as a shell's job); once two
    workers have left their mark (a file `worker-PID` in `marks`), stop it: `sig` to the whole
    group, as a terminal's Ctrl-C and `timeout` send it, or SIGKILL to the command alone (the
    OOM killer), whose workers must stop too. Returns (exit status, output, worker pids);
    after SIGKILL the status is None and the output empty, the workers checked gone."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + within
        while len(list(marks.iterdir())) < 2 and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[0].decode(errors="replace")
            time.sleep(0.1)
        workers = [int(p.name.split("-")[1]) for p in marks.iterdir()]
        assert len(workers) == 2, "the step never ran in two workers"
        if sig == signal.SIGKILL:
            proc.kill()
            proc.wait()
            assert all(gone(pid) for pid in workers)
            return None, "", workers
        os.killpg(proc.pid, sig)
        text = proc.communicate(timeout=60)[0].decode(errors="replace")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, text, workers


# Script lines for `stop_at_two_workers`: the worker function `module.name` (looked up as the
# workers start) leaves its mark in the folder `marks` (an expression such as `sys.argv[2]`,
# taken before the script goes on), then waits in its start-up, before it has set its Ctrl-C
# aside; a KeyboardInterrupt there leaves `worker-interrupted` beside that folder. The parent
# ends its workers a second late, as on a busy machine: ended at once, a worker the Ctrl-C
# interrupted had often not been scheduled to say so.
_SLOW_START = """
import multiprocessing.process, os, sys, time
from pathlib import Path
import {module} as _module

def _late(end):
    def late(self):
        time.sleep(1)
        end(self)
    return late

for _end in ("kill", "terminate"):
    setattr(multiprocessing.process.BaseProcess, _end,
            _late(getattr(multiprocessing.process.BaseProcess, _end)))
_real, _marks = _module.{name}, Path({marks})

def _starting(*args):
    (_marks / f"worker-{{os.getpid()}}").touch()
    try:
        time.sleep(30)  # (the workers are ended long before)
    except KeyboardInterrupt:
        (_marks.parent / "worker-interrupted").touch()
        raise
    _real(*args)

_module.{name} = _starting
"""


def slow_start(module: str, name: str, marks: str) -> str:
    """`_SLOW_START` for the worker function `module.name`, marks in the folder `marks`."""
    return _SLOW_START.format(module=module, name=name, marks=marks)
