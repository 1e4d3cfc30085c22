"""How a launched worker ends once it has left its process group.

Gloo's worker threads live as long as the C++ process group, and DeepSpeed keeps the group
referenced after `destroy_process_group`. A worker thread that lets go of a finished
collective's tensors once interpreter finalization has begun cannot take the GIL, and the
process aborts ("terminate called without an active exception", SIGABRT) after all its work
is done: torchrun then reports the whole run as failed. gdb on such a core:
`ProcessGroupGloo::runLoop` -> `~AsyncWork` -> `decref_pyobject` -> `take_gil` ->
`pthread_exit` while the main thread is in `Py_FinalizeEx`. So a worker that left a group of
several processes ends as Python would, up to finalization: non-daemon threads joined, exit
handlers run, streams flushed; then it exits without finalizing.

No torch import here: the CLI's entry point calls `end` on every exit.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading

_left_group = False


def left_group() -> None:
    """Called once a group of several processes is destroyed (`engine.shutdown`)."""
    global _left_group
    _left_group = True


def _status(code: object) -> int:
    """The exit status `sys.exit(code)` gives (None: 0; another non-int: printed, then 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def end(code: object) -> None:
    """Exit now as `sys.exit(code)` would if this process left a group of several; otherwise
    return (the caller exits as usual)."""
    if not _left_group:
        return
    status = _status(code)
    join_threads = getattr(threading, "_shutdown", None)  # what finalization does first
    if join_threads is not None:
        join_threads()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed, or a broken pipe
            stream.flush()
    os._exit(status)
