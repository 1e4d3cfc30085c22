"""One process at a time in a working folder.

`tibnlp pipeline run` (its work dir) and `tibnlp pretrain` (its output folder) hold
`FOLDER/.tibnlp.lock` while they write: on a shared node two invocations on one folder would
otherwise publish the same cache entry twice or interleave checkpoints. The lock file names its
holder (pid, host, process start time, command). A second process refuses at once with
`FolderBusy`, naming the folder and the holder, or with `wait=True` polls until it is free.

A lock left by a process that is gone does not block: on the same host the holder's pid is
checked (not running, a zombie, or running but started later than the lock: a reused pid), and
a stale lock is moved aside and the folder taken. A holder on another host cannot be checked
from here; the message names the file to delete once that process is known to be gone.

The lock file appears whole (written beside it, then hard-linked into place, which fails if it
exists), so a reader never sees a half-written holder. Only the narrow race of two processes
breaking the same stale lock at the same moment is settled by putting back a lock moved by
mistake.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from tibnlp.errors import TibnlpError

LOCK_NAME = ".tibnlp.lock"


class FolderBusy(TibnlpError):
    """Another process holds the folder."""

    exit_code = 3


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux /proc), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
    return int(fields[19]) if fields[0] != "Z" else -1  # -1: a zombie has ended


def alive(pid: int, start: int | None) -> bool:
    """Whether process `pid` (on this host) still runs: it exists, is no zombie, and is the
    process that started at `start` (`start_time`; None: not known), not a reused pid."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by another user
    now = start_time(pid)
    if now == -1:
        return False
    return now is None or start is None or now == start


def this_process() -> dict[str, Any]:
    """Where this process can be found again: pid, start time, host, pid namespace."""
    try:
        pid_ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        pid_ns = 0
    pid = os.getpid()
    return {"pid": pid, "start": start_time(pid), "host": socket.gethostname(), "pid_ns": pid_ns}


def _running(holder: dict[str, Any]) -> bool:
    """Whether the holder (on this host) still runs, the process that took the lock."""
    return alive(int(holder.get("pid", 0)), holder.get("start"))


def _describe(holder: dict[str, Any]) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(holder.get("since", 0)))
    return (
        f"process {holder.get('pid', '?')} on host {holder.get('host', '?')} "
        f"(since {since}: {holder.get('command', '?')})"
    )


def _read(lock: Path) -> tuple[str, dict[str, Any]] | None:
    try:
        text = lock.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        holder = json.loads(text)
    except ValueError:
        holder = {}
    return text, holder if isinstance(holder, dict) else {}


def holder_of(folder: Path) -> str:
    """Who holds `folder` now, in words ("" when free or the lock is stale): for a command
    that only reads the folder, to say that what it sees is being written."""
    found = _read(Path(folder) / LOCK_NAME)
    if found is None:
        return ""
    holder = found[1]
    if holder.get("host") == socket.gethostname() and not _running(holder):
        return ""
    return _describe(holder)


def _take(lock: Path, text: str) -> bool:
    """Create `lock` holding `text`, atomically; False when it exists (or its folder was
    removed meanwhile by the run that made it: the caller makes it again)."""
    tmp = lock.with_name(f"{lock.name}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.link(tmp, lock)
        return True
    except (FileExistsError, FileNotFoundError):
        return False
    finally:
        tmp.unlink(missing_ok=True)


def _missing(folder: Path) -> list[Path]:
    """`folder` and its parents that do not exist yet, deepest first."""
    out, path = [], folder.absolute()
    while not path.exists() and path != path.parent:
        out.append(path)
        path = path.parent
    return out


def _remove_empty(made: list[Path]) -> None:
    """Remove the folders this holder made, deepest first, while they are empty: a run that
    stops before writing anything (a config error) leaves no empty OUTPUT behind. rmdir never
    removes content: a folder written into (or taken by the next run) stays."""
    for path in sorted(made, key=lambda p: len(p.parts), reverse=True):
        try:
            path.rmdir()
        except OSError:
            return


def _break(lock: Path, seen: str) -> None:
    """Move a stale lock aside; put back a live one moved by a concurrent breaker's mistake."""
    aside = lock.with_name(f"{lock.name}.stale-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        os.replace(lock, aside)
    except FileNotFoundError:
        return
    try:
        if aside.read_text(encoding="utf-8") != seen:
            with suppress(FileExistsError):
                os.link(aside, lock)
    finally:
        aside.unlink(missing_ok=True)


@contextmanager
def hold_folder(
    folder: Path,
    wait: bool = False,
    poll_s: float = 1.0,
    notify: Callable[[str], None] | None = None,
) -> Iterator[Path]:
    """Hold `folder` (created if missing; removed again, with the parents made for it, when
    the block leaves it empty) for the block; yields the lock file.

    Refuses with `FolderBusy` while another running process holds it, or with `wait` polls
    every `poll_s` seconds (telling `notify` once whom it waits for).
    """
    folder = Path(folder)
    made: list[Path] = []
    lock = folder / LOCK_NAME
    host = socket.gethostname()
    mine = {
        **this_process(),
        "since": time.time(),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:300],
        "token": uuid.uuid4().hex,
    }
    text = json.dumps(mine, indent=1)
    told = False
    while True:
        # (again after a refusal: the holder may remove a folder it made and left empty)
        made += [p for p in _missing(folder) if p not in made]
        folder.mkdir(parents=True, exist_ok=True)
        if _take(lock, text):
            break
        found = _read(lock)
        if found is None:
            continue  # released meanwhile
        seen, holder = found
        if holder.get("host") == host and not _running(holder):
            _break(lock, seen)
            continue
        who = _describe(holder)
        if not wait:
            elsewhere = holder.get("host") != host
            raise FolderBusy(
                f"{folder} is in use by {who}",
                "wait for it to finish, or rerun with --wait to start when the folder is free"
                + (
                    f"; if that process is gone from {holder.get('host')}, delete {lock}"
                    if elsewhere
                    else ""
                ),
            )
        if notify is not None and not told:
            notify(f"waiting for {folder}: in use by {who}")
            told = True
        time.sleep(poll_s)
    try:
        yield lock
    finally:
        found = _read(lock)
        if found is not None and found[0] == text:
            lock.unlink(missing_ok=True)
        _remove_empty(made)
