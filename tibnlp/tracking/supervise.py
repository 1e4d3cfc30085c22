"""`python -m tibnlp.tracking.supervise [--grace S] CMD...`: run CMD in this process's group
and, when this process is told to stop (SIGTERM, SIGINT, SIGHUP, or the parent-death signal
after its starter was SIGKILLed), stop the whole group: CMD and everything CMD started.

Why: `mlflow server` forwards SIGTERM to its uvicorn child only; its job runner and huey
consumers are left to notice on their own, which on a loaded machine took over a minute. A
leader that signals the group itself bounds the shutdown to `GRACE` seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tibnlp.tracking.server import group_alive

GRACE = 15.0  # seconds between SIGTERM and SIGKILL to what is left of the group


class _Stop(Exception):
    pass


def _raise_stop(_signum: int, _frame: object) -> None:
    raise _Stop


def _others_left(pgid: int) -> bool:
    return bool(set(group_alive(pgid)) - {os.getpid()})


def stop_group(pgid: int, child: subprocess.Popen[bytes] | None, grace: float = GRACE) -> None:
    """SIGTERM the group (this process ignores it), then SIGKILL the rest after `grace`."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
        try:
            if sig == signal.SIGKILL:
                for pid in set(group_alive(pgid)) - {os.getpid()}:
                    os.kill(pid, sig)
            else:
                os.killpg(pgid, sig)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if child is not None:
                child.poll()  # reap our own child; grandchildren are reaped by init
            if not _others_left(pgid):
                return
            time.sleep(0.1)


def main(argv: list[str]) -> int:
    grace = GRACE
    if argv[:1] == ["--grace"] and len(argv) > 1:
        grace, argv = float(argv[1]), argv[2:]
    if not argv:
        print("usage: python -m tibnlp.tracking.supervise [--grace S] CMD...", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _raise_stop)
    pgid = os.getpgid(0)
    child = None  # a stop during Popen still reaches the new child: it is in our group
    try:
        child = subprocess.Popen(argv)
        code = child.wait()
    except _Stop:
        code = 128 + signal.SIGTERM
    finally:
        stop_group(pgid, child, grace)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
