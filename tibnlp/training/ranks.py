"""Rank 0 owns a data-parallel run's output folder: it alone reads and writes it, and the
other ranks take what it found there (`from_main`), waiting for it as long as it takes
(`wait_for_main`).

Every rank writing the same folder raced on one node: a seed's classifier folder replaced
by two processes at once failed on one of them ("Directory not empty", or the folder moved
away under it) about one time in ten with both ranks saving together, as they do. Every
rank reading its own copy instead would let ranks on nodes without a shared file system
decide differently (one resumes a seed, another trains it) and hang in the next collective.
Light on purpose: torch.distributed only, no DeepSpeed import."""

from __future__ import annotations

import itertools
import os
import time
from typing import TypeVar

import torch.distributed as dist

from tibnlp.errors import POSTED_ERROR, TibnlpError

T = TypeVar("T")

_waits = itertools.count()  # every rank passes the same waits in the same order


def is_main_process() -> bool:
    """Rank 0 of a data-parallel launch (by its RANK, known before the process group
    exists), or a process on its own: the one that tracks and holds the output folder."""
    return os.environ.get("RANK", "0") == "0"


def owns_output() -> bool:
    """Whether this process reads and writes the output folder: rank 0 of the process
    group, or any process without one (it has no rank 0 to ask)."""
    return not _grouped() or dist.get_rank() == 0


def _grouped() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def wait_for_main(poll_s: float = 0.5) -> None:
    """Rank 0 says it got here; the other ranks wait for that as long as it takes. A
    collective gives up after the process group's timeout (DeepSpeed's 10 minutes) with a
    gloo or NCCL traceback: too soon for what rank 0 alone may wait on (another run's
    output folder under `--wait`) or do (tokenise a corpus, score and upload a seed).
    Should rank 0 fail with a user error instead (posted to the store, `errors.shown_here`),
    the ranks waiting here fail with it, quietly: rank 0 printed it. Other failures are the
    launcher's to see: it stops the ranks of its node."""
    key = f"tibnlp/main-reached/{next(_waits)}"
    if not _grouped():
        return
    store = dist.distributed_c10d._get_default_store()
    if dist.get_rank() == 0:
        store.set(key, "1")
        return
    while not store.check([key]):
        if store.check([POSTED_ERROR]):
            raise TibnlpError(store.get(POSTED_ERROR).decode("utf-8"))
        time.sleep(poll_s)


def from_main(obj: T) -> T:
    """Rank 0's `obj` on every rank, once rank 0 has it (every rank calls this); `obj`
    itself without a process group."""
    if not _grouped():
        return obj
    wait_for_main()
    box: list[object] = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]  # type: ignore[return-value]
