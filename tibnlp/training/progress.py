"""A rich progress bar for training: step, loss, tokens/s, ETA (rank 0 only)."""

from __future__ import annotations

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

    def log(self, message: str) -> None:
        if self._progress is not None:
            self._progress.console.print(message)
