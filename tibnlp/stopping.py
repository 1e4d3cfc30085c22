"""How a command stops when it is told to: SIGTERM and SIGHUP as Ctrl-C, and no process left
running once the process that started it is gone.

Python's default for SIGTERM (`kill`, `docker stop`, a scheduler's time limit) and SIGHUP (a
closed terminal) ends the process on the spot: no `finally` runs, so the MLflow runs stay
RUNNING, and a pipeline's launched stage (torchrun and its workers) goes on training with
nobody to collect it. `stop_on_signals` makes both raise `Stopped`, a `KeyboardInterrupt`,
so every path Ctrl-C takes (runs ended KILLED, "interrupted: ... run again to go on") is
taken; the process then exits 128 + the signal's number, as the shell reports it.

Python runs a handler only between bytecodes, so a stop that comes during one long C call
(SentencePiece training, a collective waiting for a dead peer) would wait for the call. A
watcher thread sees each signal as it arrives (`signal.set_wakeup_fd`): a stop Python has
not taken within `TAKE_S` exits the process as the signal would have, removing the
temporaries it was writing (the next run ends its MLflow runs, `tibnlp.tracking.orphans`),
and so does a stop signal repeated after `REPEAT_S`, for a clean-up that hangs; a Ctrl-C
too, inside `ctrl_c_as_stop` (the block around such a call: SentencePiece's). A repeat
within it is the same stop (systemd sends SIGTERM and SIGHUP together). A signal another
handler took (installed later, by a plugin or library) is left to it. Forked children (pool
workers) get the defaults back. A C call that holds the GIL throughout keeps the watcher
from running too: only SIGKILL ends that.

A process started by another dies with it too: `die_with_parent` (a child's SIGTERM when its
starter dies, even by SIGKILL; Linux) and `stop_when_orphaned` (a launched worker stops once
its launcher or the pipeline above it is gone; the CLI arms it in every worker that torchrun or
DeepSpeed's launch.py started, `watch_launcher`, so a standalone `torchrun ... tibnlp pretrain`
whose torchrun is SIGKILLed stops too).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType

from tibnlp import fsutil
from tibnlp.folder_lock import alive

SIGNALS = (signal.SIGTERM, signal.SIGHUP)
TAKE_S = 5.0  # a stop Python has not taken by then exits as the signal would have
REPEAT_S = 1.0  # a stop signal within this of the first is part of the same stop


class Stopped(KeyboardInterrupt):
    """A SIGTERM or SIGHUP, raised where Ctrl-C raises KeyboardInterrupt."""

    def __init__(self, signum: int) -> None:
        super().__init__(int(signum))  # (args rebuild it: copy and pickle work)
        self.signum = int(signum)

    def __str__(self) -> str:
        return signal.Signals(self.signum).name


_received: int | None = None  # the signal that stopped this process, if one did
_taken = threading.Event()  # Python's handler has run: the clean-up is under way
_wakeup = -1  # the watcher's pipe, written by Python's C-level handler
_generation = 0  # bumped when the handlers are set again: the watcher forgets the last stop
POLL_S = 0.25  # while a stop is under way, the watcher looks at least this often


def _raise_stopped(signum: int, _frame: FrameType | None) -> None:
    global _received
    if _taken.is_set():  # one stop; a repeat is the watcher's to judge
        return
    _received = signum
    _taken.set()
    raise Stopped(signum)


def _ours(signum: int) -> bool:
    """The signal is handled by `_raise_stopped` (not ignored, not another's handler)."""
    return signal.getsignal(signum) is _raise_stopped


_say_fd = 2  # where `_exit_now` says why: the terminal's stderr while fd 2 is redirected


@contextlib.contextmanager
def saying_to(fd: int) -> Iterator[None]:
    """While fd 2 is redirected (SentencePiece's log into a pipe whose reader dies with the
    process), a forced exit says why on `fd`, the stderr the user sees."""
    global _say_fd
    before, _say_fd = _say_fd, fd
    try:
        yield
    finally:
        _say_fd = before


def _exit_now(signum: int, why: str) -> None:
    """Exit 128 + signum now, saying why only where stderr can take it at once (a full pipe
    nobody reads must not keep the process; no thread: none starts at interpreter exit)."""
    try:
        if select.select([], [_say_fd], [], 0.5)[1]:  # (a pipe: room for PIPE_BUF bytes)
            name = signal.Signals(signum).name
            os.write(
                _say_fd, f"\n{name}: {why}; exiting now (its temporary files removed)\n".encode()
            )
    except (OSError, ValueError):
        pass
    finally:
        # no `finally` runs after this: nothing half-written is left (whatever the removal
        # meets, the exit comes)
        with contextlib.suppress(BaseException):
            fsutil.remove_staged()
        os._exit(128 + signum)


def _watch(read_fd: int) -> None:
    """Python's handler runs only between bytecodes; this thread sees each signal as its
    byte arrives. A stop (`_ours`) not taken within TAKE_S exits; so does a stop signal that
    arrives after the watcher found the pipe empty more than REPEAT_S after the first (a
    repeat, not the same burst: timed by what the watcher saw, never by when it got the GIL
    back, so a busy clean-up is not taken for a repeat)."""
    generation = _generation
    first = 0.0  # when the current stop was seen (0: none)
    quiet = 0.0  # the last time the pipe was found empty during it
    pending = 0  # the stop's signal while not yet taken
    while True:
        before = time.monotonic()  # (select's return may wait for the GIL: time it here)
        try:
            ready, _, _ = select.select([read_fd], [], [], POLL_S if first else None)
        except OSError:
            return
        now = time.monotonic()
        if generation != _generation:  # the handlers were set again: a new start
            generation, first, quiet, pending = _generation, 0.0, 0.0, 0
        if pending and (_taken.is_set() or not _ours(pending)):
            pending = 0
        if pending and now - first >= TAKE_S:
            _exit_now(pending, f"not taken within {TAKE_S:.0f} s (a call Python waits on)")
        if not ready:
            quiet = before  # the pipe was empty from then at least
            continue
        try:
            arrived = os.read(read_fd, 64)
        except OSError:
            return
        for signum in arrived:
            if not _ours(signum):  # (SIGINT only inside `ctrl_c_as_stop`)
                continue
            if not first:
                first, pending = now, signum
            elif quiet - first > REPEAT_S:
                _exit_now(signum, "sent again while stopping")


def _forget_in_child() -> None:
    """A forked child (a pool's worker) stops as Python's default would, its signals no
    longer reach the parent's watcher, and it has no orphan watch (the thread is the
    parent's) until it arms its own."""
    global _wakeup, _orphan_watch
    _orphan_watch = None
    _above.clear()
    if _wakeup == -1:
        return  # (this process never stopped on signals)
    _wakeup = -1  # (the pipe is the parent's; a child that stops on signals makes its own)
    try:
        signal.set_wakeup_fd(-1)
        for sig in SIGNALS:
            if signal.getsignal(sig) is _raise_stopped:
                signal.signal(sig, signal.SIG_DFL)
    except ValueError:  # (not the child's main thread)
        pass


def stop_on_signals() -> None:
    """SIGTERM and SIGHUP raise `Stopped` from now on, watched as the module says. From the
    main thread only (elsewhere: nothing). A signal the process was started with ignored
    stays ignored: `nohup` keeps a command past logout."""
    global _received, _wakeup, _generation
    if threading.current_thread() is not threading.main_thread():
        return
    _received = None
    _generation += 1
    _taken.clear()
    for sig in SIGNALS:
        if signal.getsignal(sig) in (signal.SIG_DFL, _raise_stopped):
            signal.signal(sig, _raise_stopped)
    if _wakeup == -1:  # one watcher per process
        read_fd, _wakeup = os.pipe()
        os.set_blocking(_wakeup, False)
        threading.Thread(target=_watch, args=(read_fd,), name="tibnlp-stop", daemon=True).start()
    signal.set_wakeup_fd(_wakeup, warn_on_full_buffer=False)


@contextlib.contextmanager
def ctrl_c_as_stop() -> Iterator[None]:
    """Within the block, Ctrl-C stops as SIGTERM does: Python's own SIGINT handler runs only
    between bytecodes, so a Ctrl-C during one long C call (SentencePiece training: minutes on a
    large corpus) did nothing until the call returned, and the watcher took only SIGTERM and
    SIGHUP. Where SIGINT has Python's default handler, from the main thread; elsewhere a
    no-op."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    signal.signal(signal.SIGINT, _raise_stopped)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@contextlib.contextmanager
def ctrl_c_held() -> Iterator[None]:
    """Within the block (the forks that start a pool's workers), a Ctrl-C waits, and is
    delivered as the block ends. A forked worker starts with its parent's SIGINT handler, so
    a Ctrl-C reaching it before its first act (ignoring SIGINT: the parent stops the pool)
    raised KeyboardInterrupt in its start-up: "Process ForkPoolWorker-N: Traceback ...". A
    worker forked here holds it instead, until it ignores SIGINT; and the parent is not
    interrupted halfway through starting the pool, whose clean-up covers an Exception only.
    Where SIGINT is ignored, or not from the main thread: a no-op."""
    held: list[int] = []

    def hold(signum: int, _frame: FrameType | None) -> None:
        held.append(signum)

    try:
        before = signal.signal(signal.SIGINT, hold)
    except ValueError:  # (not the main thread)
        yield
        return
    if before is signal.SIG_IGN:
        signal.signal(signal.SIGINT, before)
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
        if held:  # as it came: the handler it was meant for takes it
            signal.raise_signal(signal.SIGINT)


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
    """The SIGTERM or SIGHUP (or a Ctrl-C in `ctrl_c_as_stop`) that stopped this process,
    None when none did."""
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


# what the launchers we know put in their workers' environment: torchrun's agent, and
# DeepSpeed's launch.py (a worker's parent is then its launcher)
LAUNCHER_ENV = ("TORCHELASTIC_RUN_ID", "CROSS_RANK")

_above: list[tuple[int, int | None]] = []  # processes above the parent, watched as well
_orphan_watch: threading.Thread | None = None


def started_by_launcher() -> bool:
    """True in a worker that torchrun or DeepSpeed's launch.py started. Only there is a
    changed parent a dead launcher: a user's own `nohup` command is reparented at logout and
    must run on."""
    return any(k in os.environ for k in LAUNCHER_ENV)


def watch_launcher() -> None:
    """In a launcher's worker, stop once the launcher is gone (`stop_when_orphaned`): torch
    leaves a SIGKILLed torchrun's workers running, in a session of their own. Called as
    early as the CLI can (its package's import): a launcher killed before this runs goes
    unnoticed. DeepSpeed's `deepspeed` command is a runner above launch.py: a runner killed
    alone leaves launch.py, the workers' parent, alive, and them with it."""
    if started_by_launcher():
        stop_when_orphaned()


def stop_when_orphaned(
    above: tuple[int, int | None] | None = None, poll_s: float = 1.0
) -> threading.Thread:
    """Send this process SIGTERM once its parent is gone, or the process `above` (pid, start
    time: a pipeline that started this worker's launcher), which covers a launcher that died
    before this process could note it as its parent; polled from a daemon thread, one per
    process (a second call adds its `above` to it)."""
    global _orphan_watch
    if above is not None:
        _above.append(above)
    if _orphan_watch is not None:
        return _orphan_watch
    parent = os.getppid()

    def gone() -> bool:
        return os.getppid() != parent or any(not alive(*a) for a in list(_above))

    def watch() -> None:
        stop = threading.Event()
        while not stop.wait(poll_s):
            if gone():
                if not _taken.is_set():  # (already stopping: not a second signal)
                    os.kill(os.getpid(), signal.SIGTERM)
                return

    _orphan_watch = threading.Thread(target=watch, name="tibnlp-orphan-watch", daemon=True)
    _orphan_watch.start()
    return _orphan_watch


os.register_at_fork(after_in_child=_forget_in_child)  # (once: children inherit it)
