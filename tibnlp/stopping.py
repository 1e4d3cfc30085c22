"""How a command stops when it is told to: SIGTERM and SIGHUP as Ctrl-C, and no process left
running once the process that started it is gone.

Python's default for SIGTERM (`kill`, `docker stop`, a scheduler's time limit) and SIGHUP (a
closed terminal) ends the process on the spot: no `finally` runs, so the MLflow runs stay
RUNNING, and a pipeline's launched stage (torchrun and its workers) goes on training with
nobody to collect it. `stop_on_signals` makes both raise `Stopped`, a `KeyboardInterrupt`,
so every path Ctrl-C takes (runs ended KILLED, "interrupted: ... run again to go on") is
taken; the process then exits 128 + the signal's number, as the shell reports it. A second
signal kills at once, for a clean-up that hangs.

A process started by another dies with it too: `die_with_parent` (a child's SIGTERM when its
starter dies, even by SIGKILL; Linux) and `stop_when_orphaned` (a launched worker, whose
launcher may be killed together with the pipeline, stops when it is orphaned).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType

SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """A SIGTERM or SIGHUP, raised where Ctrl-C raises KeyboardInterrupt."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_received: int | None = None  # the signal that stopped this process, if one did


def _raise_stopped(signum: int, _frame: FrameType | None) -> None:
    global _received
    _received = signum
    for sig in SIGNALS:  # a second signal ends the process at once
        signal.signal(sig, signal.SIG_DFL)
    raise Stopped(signum)


def stop_on_signals() -> None:
    """SIGTERM and SIGHUP raise `Stopped` from now on (main thread only). A signal the
    process was started with ignored stays ignored: `nohup` keeps a command past logout."""
    for sig in SIGNALS:
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _raise_stopped)


def exit_status(interrupt: BaseException | None = None) -> int:
    """The exit status of a command a stop ended: 128 + the signal (Ctrl-C: 130)."""
    signum = getattr(interrupt, "signum", None) or _received or signal.SIGINT
    return 128 + int(signum)


def ended_status(exc: BaseException | None) -> str:
    """The MLflow status of a run that `exc` ended: KILLED when stopped (Ctrl-C, SIGTERM,
    SIGHUP), FAILED on an error, FINISHED without one."""
    if exc is None:
        return "FINISHED"
    return "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"


def stopped_by_signal() -> int | None:
    """The SIGTERM or SIGHUP that stopped this process, None when none did."""
    return _received


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` giving the child SIGTERM when this process dies, even by SIGKILL
    (Linux's PR_SET_PDEATHSIG); None elsewhere. prctl is looked up here, before the fork:
    the child calls it and nothing else."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # died before the line above: no signal will come
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


def stop_when_orphaned(poll_s: float = 1.0) -> threading.Thread:
    """Send this process SIGTERM once its parent is gone (a launched worker whose launcher
    was killed with the pipeline that started it); polled from a daemon thread."""
    parent = os.getppid()

    def watch() -> None:
        stop = threading.Event()
        while not stop.wait(poll_s):
            if os.getppid() != parent:
                os.kill(os.getpid(), signal.SIGTERM)
                return

    thread = threading.Thread(target=watch, name="tibnlp-orphan-watch", daemon=True)
    thread.start()
    return thread
