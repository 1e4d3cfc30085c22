"""Whether a process is still running, for the tests that stop a command and then look for
workers it left (a zombie, waiting for its parent to collect it, runs nothing)."""

from __future__ import annotations

import os
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
