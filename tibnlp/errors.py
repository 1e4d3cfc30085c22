"""User-facing errors.

Every failure a user can cause (bad input file, bad config key, missing dataset) is raised as a
`TibnlpError`: the CLI prints its message and hint without a stack trace and exits non-zero.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from datetime import timedelta

from tibnlp.training import worker_exit


class TibnlpError(Exception):
    """An error caused by input, configuration or environment, with a hint on what to do."""

    exit_code = 2
    alone = False  # met by this process alone, never posted by rank 0 (`shown_here`)

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class ConfigError(TibnlpError):
    """A configuration key or value is invalid; the message names the key and what is allowed."""


class DataError(TibnlpError):
    """An input file or dataset is missing or malformed; the message names the file (and line)."""


POSTED_ERROR = "tibnlp/error"  # the group's store key rank 0 puts its error under


def shown_here(message: str, wait_s: float = 5.0, alone: bool = False) -> bool:
    """Whether this process prints a user error. The processes of a launched run mostly meet
    the same one (same arguments, same files), and N copies of a message bury it. Before the
    process group, the first process of each node prints (a node may lack a file), and the
    others wait for it to (`wait_s`), printing their own if they are not stopped; within it,
    rank 0 prints and posts its message to the group's store, and another rank prints only an
    error rank 0 has not posted within `wait_s` (its own: rank 0 then waits in a collective,
    and the launcher stops it once this one exits). `alone`: an error rank 0 cannot post (of
    a rank 0 gone: `TibnlpError.alone`), said at once."""
    if alone or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return True
    dist = sys.modules.get("torch.distributed")  # (imported by then if the group was started)
    if dist is None or not dist.is_initialized():
        if os.environ.get("LOCAL_RANK", "0") == "0":
            return True
        # local rank 0 mostly meets the same error and prints it, and once it exits the
        # launcher stops this one. Exiting at once instead got this rank's exit seen first
        # and rank 0 stopped before it printed: no message at all. Still here after the wait,
        # the error is this rank's own.
        try:
            time.sleep(wait_s)
        except KeyboardInterrupt:  # stopped by the launcher: rank 0 has said it
            return False
        return True
    try:
        store = dist.distributed_c10d._get_default_store()
        if dist.get_rank() == 0:
            store.set(POSTED_ERROR, message)
            return True
        store.wait([POSTED_ERROR], timedelta(seconds=wait_s))
        return bool(store.get(POSTED_ERROR).decode("utf-8") != message)
    except Exception:  # no store, or rank 0's error not posted in time: say it here
        return True


def run_script(main: Callable[[], object]) -> None:
    """A script's entry (`benchmarks/*.py`): a TibnlpError, a user's mistake, prints its
    message and hint without a traceback and exits with its code, as the CLI does."""
    try:
        main()
    except SystemExit as exc:
        worker_exit.end(exc.code)
        raise
    except TibnlpError as exc:
        if shown_here(exc.message, alone=exc.alone):
            print(f"error: {exc.message}", file=sys.stderr)
            if exc.hint:
                print(f"hint: {exc.hint}", file=sys.stderr)
        worker_exit.end(exc.exit_code)
        raise SystemExit(exc.exit_code) from None
    worker_exit.end(0)
