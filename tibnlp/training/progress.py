"""A rich progress bar for training: step, loss, tokens/s, ETA (rank 0 only).

Under a time or token budget the bar counts per mille of the budget, not steps: a budgeted
run plans far more steps than it takes, and an ETA from steps would be meaningless."""

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

    BUDGET_UNITS = 1000

    def __init__(
        self,
        total: int,
        start: int,
        enabled: bool,
        description: str = "pretrain",
        budget_share: float | None = None,
    ):
        """`budget_share`: the share of the budget already spent, or None without a budget."""
        self.enabled = enabled
        self.budgeted = budget_share is not None
        self._step = start
        if budget_share is not None:
            total, start = self.BUDGET_UNITS, self._units(budget_share)
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

    def _units(self, share: float) -> int:
        return int(self.BUDGET_UNITS * min(1.0, max(0.0, share)))

    def update(
        self,
        step: int,
        loss: float | None = None,
        tokens_per_s: float | None = None,
        budget_share: float | None = None,
    ):
        if self._progress is None:
            return
        self._step = step
        if self.budgeted and budget_share is not None:
            step = self._units(budget_share)
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
        where = (
            f"step {self._step}, {step / self.BUDGET_UNITS:.1%} of budget"
            if self.budgeted
            else f"step {step}/{self._total}"
        )
        self._progress.console.print(
            f"{task.description} {where} loss {task.fields['loss']} "
            f"{task.fields['tps']} tok/s ETA {'-' if eta is None else f'{eta / 60:.1f} min'}"
        )

    def log(self, message: str) -> None:
        if self._progress is not None:
            self._progress.console.print(message)
