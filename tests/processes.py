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
