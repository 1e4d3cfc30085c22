"""A rich progress bar for training: step, loss, tokens/s, ETA (rank 0 only)."""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class TrainProgress:
    """No-op when disabled, so the loop calls it the same way on every rank."""

    def __init__(self, total: int, start: int, enabled: bool, description: str = "pretrain"):
        self.enabled = enabled
        self._progress: Progress | None = None
        if not enabled:
            return
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[tps]} tok/s"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self._total = total
        self._last_line = 0.0
        self._task = self._progress.add_task(
            description, total=total, completed=start, loss="-", tps="-"
        )

    def __enter__(self) -> TrainProgress:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.stop()

    def update(self, step: int, loss: float | None = None, tokens_per_s: float | None = None):
        if self._progress is None:
            return
        fields: dict[str, Any] = {}
        if loss is not None:
            fields["loss"] = f"{loss:.4f}"
        if tokens_per_s is not None:
            fields["tps"] = f"{tokens_per_s:,.0f}"
        self._progress.update(self._task, completed=step, **fields)
        if not self._progress.console.is_terminal:
            self._plain_line(step)

    def _plain_line(self, step: int) -> None:
        """Logs have no live bar: a plain line every 30 s keeps step, rate and ETA visible."""
        assert self._progress is not None
        now = time.monotonic()
        if now - self._last_line < 30.0 and step < self._total:
            return
        self._last_line = now
        task = self._progress.tasks[0]
        eta = task.time_remaining
        self._progress.console.print(
            f"{task.description} step {step}/{self._total} loss {task.fields['loss']} "
            f"{task.fields['tps']} tok/s ETA {'-' if eta is None else f'{eta / 60:.1f} min'}"
        )

    def log(self, message: str) -> None:
        if self._progress is not None:
            self._progress.console.print(message)
