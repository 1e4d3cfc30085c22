"""A standalone run's output folder: held for the run, and noting the MLflow run it has open.

`tibnlp pretrain` and `tibnlp finetune` write checkpoints, seed records and classifiers into
their output folder. The main process holds it (`tibnlp.folder_lock`), so a second run on the
same folder refuses at once (or with `--wait` starts when it is free) instead of training the
same seeds beside it. Held, the folder also tells a dead run from a live one: a run killed
outright (SIGKILL, the OOM killer) left its runs RUNNING and its note in the folder's ledger,
and the next run ends them KILLED (`tibnlp.tracking.orphans`). A pipeline stage's runs are its
pipeline's business: there the folder is held, but no run is noted or ended.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from tibnlp.folder_lock import hold_folder
from tibnlp.tracking.orphans import close_run, end_orphans, open_run


class OpenRun(Protocol):
    """What is noted of a tracker (`tibnlp.tracking.Tracker`)."""

    enabled: bool
    run_id: str | None
    uri: str
    ended: bool


NoteRun = Callable[[OpenRun], None]


def _no_note(_run: OpenRun) -> None:
    return None


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@contextmanager
def held_output(
    folder: Path,
    main: bool,
    standalone: bool,
    wait: bool,
    meet: Callable[[str], None] | None = None,
    say: Callable[[str], None] = _to_stderr,
) -> Iterator[NoteRun]:
    """Hold `folder` on the main process (the other ranks of a data-parallel run read and
    write none of it, `ranks`); yields `note(tracker)`, which notes the run once it is open.
    Every run noted and ended is taken off the ledger when the block ends: only a process
    killed outright, or stopped before its run ended, leaves its note. Every rank calls
    `meet` (`ranks.wait_for_main`) before its block: the others wait there, however long
    `--wait` takes, until the main process holds the folder (a collective would time out
    first)."""
    if not main:
        if meet is not None:
            meet(f"hold the output folder {folder}")
        yield _no_note
        return
    noted: list[OpenRun] = []

    def note(run: OpenRun) -> None:
        if standalone and run.enabled and run.run_id:
            open_run(folder, run.run_id, run.uri)
            noted.append(run)

    with hold_folder(folder, wait=wait, notify=say):
        if standalone:  # the folder is held: a noted run's process is gone
            end_orphans(folder, say)
        if meet is not None:
            meet(f"hold the output folder {folder}")
        try:
            yield note
        finally:  # (a run a stop cut off before it ended stays noted: the next run ends it)
            for run in noted:
                if run.ended:
                    close_run(folder, run.run_id)
