"""The UI server's supervisor takes its whole process group down: on a stop signal (what the
parent-death signal delivers when `tibnlp ui` is SIGKILLed), and when the command ends."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tibnlp.tracking.server import group_alive

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")

STUBBORN = "trap '' TERM; sleep 300 & sleep 300"  # both sleeps inherit the ignored SIGTERM


def _supervise(script: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "tibnlp.tracking.supervise", "--grace", "1", "sh", "-c", script]
    return subprocess.Popen(cmd, start_new_session=True)


def _wait_for(cond, within: float = 30) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return False


def test_stop_signal_takes_down_processes_that_ignore_sigterm() -> None:
    proc = _supervise(STUBBORN)
    try:
        assert _wait_for(lambda: len(group_alive(proc.pid)) >= 4)  # python, sh, two sleeps
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        assert _wait_for(lambda: not group_alive(proc.pid)), group_alive(proc.pid)
    finally:
        if group_alive(proc.pid):
            subprocess.run(["kill", "-9", f"-{proc.pid}"], check=False)


def test_command_exit_is_passed_on_and_leftovers_stopped() -> None:
    proc = _supervise("sleep 300 & exit 3")
    try:
        assert proc.wait(timeout=30) == 3
        assert _wait_for(lambda: not group_alive(proc.pid)), group_alive(proc.pid)
    finally:
        if group_alive(proc.pid):
            subprocess.run(["kill", "-9", f"-{proc.pid}"], check=False)
