"""Rank 0 owns a data-parallel run's output folder: it alone reads and writes it, and the
other ranks take what it found there (`from_main`), waiting for it as long as it takes
(`wait_for_main`).

Every rank writing the same folder raced on one node: a seed's classifier folder replaced
by two processes at once failed on one of them ("Directory not empty", or the folder moved
away under it) about one time in ten with both ranks saving together, as they do. Every
rank reading its own copy instead would let ranks on nodes without a shared file system
decide differently (one resumes a seed, another trains it) and hang in the next collective.

"As long as it takes" has no timeout (rank 0 may tokenise for an hour, or wait for another
run's folder under `--wait`), so a waiting rank looks for rank 0 instead: rank 0 says in the
group's store who it is (`announce_main`, as the group starts) and that it ended (at exit);
a rank on rank 0's machine sees at once that its process is gone (killed outright: SIGKILL,
the OOM killer), and any rank sees the store itself go (rank 0, or the launcher that held
it, gone). Where rank 0's process cannot be looked at (another node), a rank waits at most
`TIBNLP_MAIN_WAIT_S` seconds (a day unless set; set, it holds on every node; 0: no limit).
Light on purpose: torch.distributed only, no DeepSpeed import."""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import time
from pathlib import Path
from typing import Any, TypeVar

import torch.distributed as dist

from tibnlp.errors import POSTED_ERROR, ConfigError, TibnlpError
from tibnlp.folder_lock import alive, this_process

T = TypeVar("T")

_waits = itertools.count()  # every rank passes the same waits in the same order

MAIN_PROCESS = "tibnlp/main-process"  # the store key rank 0 says who it is under
MAIN_ENDED = "tibnlp/main-ended"  # set by rank 0 as its process ends
LIMIT_ENV = "TIBNLP_MAIN_WAIT_S"
UNSEEN_LIMIT_S = 24 * 3600.0  # the default wait for a rank 0 that cannot be looked at
_announced: list[Any] = []  # the store rank 0 announced itself in (once per group)


class MainGone(TibnlpError):
    """Rank 0 ended, or cannot be reached, before getting where the other ranks wait."""

    alone = True  # (rank 0 cannot say it: each waiting rank does, at once)


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


def wait_limit() -> float | None:
    """`TIBNLP_MAIN_WAIT_S` in seconds (0: no limit), None when not set."""
    text = os.environ.get(LIMIT_ENV, "").strip()
    if not text:
        return None
    try:
        limit = float(text)
    except ValueError:
        limit = -1.0
    if not limit >= 0 or limit == float("inf"):
        raise ConfigError(
            f"environment variable {LIMIT_ENV}={text!r}: the seconds a rank waits for rank 0 "
            "at most must be a number >= 0",
            f"set {LIMIT_ENV} to a number of seconds (0: no limit), or unset it (a day)",
        )
    return limit


def _machine() -> dict[str, Any]:
    """This process as `this_process` names it, and the boot it runs in: host names and pid
    namespaces repeat across machines (every host's first namespace has one inode)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return {**this_process(), "boot": boot}


def announce_main() -> None:
    """As a process group starts (`engine.init_distributed`): rank 0 says who it is and, at
    exit, that it ended; every rank checks `TIBNLP_MAIN_WAIT_S` now, not after rank 0's hour."""
    wait_limit()
    if not _grouped() or dist.get_rank() != 0:
        return
    store = dist.distributed_c10d._get_default_store()
    if any(s is store for s in _announced):
        return
    _announced.append(store)
    store.set(MAIN_PROCESS, json.dumps(_machine()))

    def ended() -> None:  # (the store may be gone by then: its holder ended first)
        with contextlib.suppress(Exception):
            store.set(MAIN_ENDED, "1")

    atexit.register(ended)


def wait_for_main(what: str = "get here", poll_s: float = 0.5) -> None:
    """Rank 0 says it got here; the other ranks wait for that as long as it takes. A
    collective gives up after the process group's timeout (DeepSpeed's 10 minutes) with a
    gloo or NCCL traceback: too soon for what rank 0 alone may wait on (another run's
    output folder under `--wait`) or do (tokenise a corpus, score and upload a seed).
    Should rank 0 fail with a user error instead (posted to the store, `errors.shown_here`),
    the ranks waiting here fail with it, quietly: rank 0 printed it. Should rank 0 end, or
    be gone, without getting here, they fail with `MainGone` saying so (module docstring).
    `what`: what rank 0 does before it gets here, for that message."""
    key = f"tibnlp/main-reached/{next(_waits)}"
    if not _grouped():
        return
    store = dist.distributed_c10d._get_default_store()
    if dist.get_rank() == 0:
        store.set(key, "1")
        return
    try:
        _await(store, key, what, poll_s)
    except RuntimeError as exc:  # (torch's store errors: DistNetworkError, DistStoreError)
        where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
        raise MainGone(
            f"rank {dist.get_rank()} lost the process group's store ({where}) while waiting "
            f"for rank 0 to {what}: rank 0, or the launcher that held the store, is gone "
            f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})",
            "rank 0's output (or its launcher's) says why; run the command again once fixed",
        ) from None


def _await(store: Any, key: str, what: str, poll_s: float) -> None:
    """Wait for `key`; raise when rank 0 posted an error, ended, is gone or over the limit.
    That rank 0 ended is seen before `key` and its error are looked at: it set them first."""
    set_limit, began, main = wait_limit(), time.monotonic(), None
    rank, hint = dist.get_rank(), "rank 0's output says why; run the command again once fixed"
    mine = _machine()
    while True:
        if main is None and store.check([MAIN_PROCESS]):
            main = json.loads(store.get(MAIN_PROCESS).decode("utf-8"))
        here = main is not None and all(main[k] == mine[k] for k in ("host", "pid_ns", "boot"))
        who = f"rank 0 (process {main['pid']} on {main['host']})" if main else "rank 0"
        gone = None
        if main is not None and here and not alive(int(main["pid"]), main["start"]):
            gone = MainGone(
                f"{who} is gone before it could {what} (killed outright: SIGKILL, the OOM "
                f"killer?); rank {rank} waited for it",
                f"{hint}, or the system log (dmesg) if it says nothing",
            )
            if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
                raise gone  # it held the store (torchrun's agent holds it otherwise): gone too
        elif store.check([MAIN_ENDED]):
            gone = MainGone(f"{who} ended before it could {what}; rank {rank} waited for it", hint)
        if store.check([key]):
            return
        if store.check([POSTED_ERROR]):
            raise TibnlpError(store.get(POSTED_ERROR).decode("utf-8"))
        if gone is not None:
            raise gone
        waited = time.monotonic() - began
        limit = set_limit if set_limit is not None else (None if here else UNSEEN_LIMIT_S)
        if limit and waited > limit:
            why = "" if set_limit is not None else f": {who} cannot be looked at from here"
            raise MainGone(
                f"rank {rank} waited {waited:.0f} s for {who} to {what}, the limit "
                f"({LIMIT_ENV}{why})",
                f"if rank 0 may take longer, set {LIMIT_ENV} to more seconds (0: no limit)",
            )
        time.sleep(poll_s)


def from_main(obj: T, what: str = "get its result") -> T:
    """Rank 0's `obj` on every rank, once rank 0 has it (every rank calls this); `obj`
    itself without a process group. `what`: as `wait_for_main`'s."""
    if not _grouped():
        return obj
    wait_for_main(what)
    box: list[object] = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]  # type: ignore[return-value]
