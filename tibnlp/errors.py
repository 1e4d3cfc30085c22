"""User-facing errors.

Every failure a user can cause (bad input file, bad config key, missing dataset) is raised as a
`TibnlpError`: the CLI prints its message and hint without a stack trace and exits non-zero.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from tibnlp.training import worker_exit


class TibnlpError(Exception):
    """An error caused by input, configuration or environment, with a hint on what to do."""

    exit_code = 2

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


def run_script(main: Callable[[], object]) -> None:
    """A script's entry (`benchmarks/*.py`): a TibnlpError, a user's mistake, prints its
    message and hint without a traceback and exits with its code, as the CLI does."""
    try:
        main()
    except SystemExit as exc:
        worker_exit.end(exc.code)
        raise
    except TibnlpError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        worker_exit.end(exc.exit_code)
        raise SystemExit(exc.exit_code) from None
    worker_exit.end(0)
