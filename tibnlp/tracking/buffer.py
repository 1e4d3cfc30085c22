"""The offline buffer: every tracking call as one JSON line, replayed when the server is back.

A record is a self-contained operation (`OPS`: `create_run`, `log_batch`, `log_artifact`,
`register_model`, `set_experiment_tags`, `update_run`, `set_terminated`) with its original
timestamps, so a replay writes exactly what would have been written live. Runs created while
the server was away get a local id (`offline-...`); replay maps them to real ids and remembers
the mapping in `ids.json` beside the buffers, so nested runs buffered in other files resolve
their parent.
Every run also carries its local id as a tag (`TAG_LOCAL_ID`): a replayed `create_run` whose
answer was lost, or whose mapping is, finds its run instead of making a second one. A damaged
`ids.json` is never read as empty nor overwritten: it stops the replay (`DamagedIds`).

The records are sent by `Applier` (`tracking.replay`, which also replays a buffer file);
`tracking.sync` replays the buffers of a folder (`tibnlp runs sync`).

Metric records keep their original timestamp: MLflow's SQL store treats (key, step,
timestamp, value) as one row, so a record replayed twice (the server took it but the answer
was lost) is still stored once.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from mlflow.exceptions import MlflowException

from tibnlp.errors import DataError
from tibnlp.fsutil import atomic_write_text, text_lines

OFFLINE_PREFIX = "offline-"
PARENT_TAG = "mlflow.parentRunId"
IDS_FILE = "ids.json"
# on every run tibnlp creates: its local id, so a replayed `create_run` whose answer was lost
# (or whose `ids.json` entry is) finds the run it made instead of making a second one
TAG_LOCAL_ID = "tibnlp.local_id"
OFFLINE_ID = re.compile(re.escape(OFFLINE_PREFIX) + "[0-9a-f]{32}")  # `new_local_id`
# the operations a record may hold: `Applier` (`tracking.replay`) sends each with its method
# `_op_<operation>`; a line of any other is damaged (`parse`), never sent
OPS = frozenset(
    {
        "create_run",
        "update_run",
        "log_batch",
        "log_artifact",
        "register_model",
        "set_experiment_tags",
        "set_terminated",
    }
)


class PendingParent(Exception):
    """A record names a run that was created offline and is not replayed yet."""


class DamagedIds(DataError):
    """`ids.json` cannot be read: the runs it mapped are unknown, and it must not be
    overwritten (their buffered calls would wait forever, or create their runs again)."""

    def __init__(self, path: Path, why: str, needed: str = "") -> None:
        super().__init__(
            f"{path} is damaged ({why}); it maps runs created offline to their ids in the "
            "tracking store: no buffered call was sent, and the file was left as it is"
            + (f"; the buffers left need it for {needed}" if needed else ""),
            'repair it (one JSON object: {"offline-...": "RUN_ID", ...}), or move it away: '
            f"then a run it mapped is found in the store by its tag {TAG_LOCAL_ID}, and "
            "`tibnlp runs sync` names the buffered calls whose run cannot be found",
        )
        self.path, self.why = path, why


def default_buffer_dir(configured: str = "") -> Path:
    return Path(configured or os.environ.get("TIBNLP_TRACKING_BUFFER") or ".tibnlp/tracking-buffer")


def now_ms() -> int:
    return int(time.time() * 1000)


def new_local_id() -> str:
    return OFFLINE_PREFIX + uuid.uuid4().hex


def interrupted(exc: BaseException) -> bool:
    """True when a Ctrl-C (KeyboardInterrupt) lies in the exception's cause/context chain: it
    arrived inside the store's call, and the store's clean-up (a rollback on a locked sqlite
    file, say) raised its own error over it. That is the user stopping the run, not an outage."""
    todo: list[BaseException | None] = [exc]
    seen: set[int] = set()
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, KeyboardInterrupt):
            return True
        todo += [e.__cause__, e.__context__]
    return False


def is_outage(exc: BaseException) -> bool:
    """True when the store could not be reached (worth buffering), not when it said no."""
    import requests

    if isinstance(exc, (requests.RequestException, ConnectionError, TimeoutError, OSError)):
        return True
    if isinstance(exc, (PendingParent, DamagedIds)):  # kept, in order, until it can be sent
        return True
    if isinstance(exc, MlflowException):
        if exc.error_code in {
            "INTERNAL_ERROR",
            "TEMPORARILY_UNAVAILABLE",
            "REQUEST_LIMIT_EXCEEDED",
        }:
            return True
        text = str(exc)
        markers = ("API request to", "Max retries", "Connection", "timed out", "database is locked")
        return any(m in text for m in markers)
    # sqlalchemy OperationalError (locked / unreachable database) surfaces unwrapped sometimes
    return type(exc).__name__ in {"OperationalError", "DisconnectionError"}


class IdMap:
    """offline id -> real run id, shared by all buffers of one directory (and by the
    processes that replay them: `add` merges into the file under a lock, never over it).

    A damaged file is never ignored nor overwritten: `check`, a `resolve` that needs it and
    a persisted `add` raise `DamagedIds`, which stops a replay as an outage does."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / IDS_FILE
        self.ids: dict[str, str] = {}
        # a live tracker starts whatever the file holds: it is needed only by a replay
        with contextlib.suppress(DamagedIds):
            self.ids.update(self._read())

    def _read(self) -> dict[str, str]:
        """The file's mapping ({} when there is none); `DamagedIds` when it is no mapping."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as exc:
            raise DamagedIds(self.path, f"unreadable: {exc}") from exc
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise DamagedIds(self.path, f"not JSON: {exc}") from exc
        if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and v for k, v in data.items()
        ):
            raise DamagedIds(self.path, 'not an object of "offline-..." ids to run ids')
        return data

    def check(self) -> None:
        """Raise `DamagedIds` when the file is damaged (re-read: it may have been repaired)."""
        self.ids.update(self._read())

    def resolve(self, run_id: str | None) -> str | None:
        if run_id is None or not run_id.startswith(OFFLINE_PREFIX):
            return run_id
        if run_id not in self.ids:  # another tracker (a parent) may have replayed it meanwhile
            self.ids.update(self._read())
        if run_id in self.ids:
            return self.ids[run_id]
        raise PendingParent(run_id)

    def add(self, local: str, real: str, persist: bool) -> None:
        if persist:  # only runs created from a buffer can be named by other buffers
            with _locked(self.folder):  # read-merge-write: another process's entries stay
                merged = {**self._read(), local: real}
                atomic_write_text(self.path, json.dumps(merged, indent=1))
            self.ids.update(merged)
        self.ids[local] = real


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """`folder` locked (flock on the folder itself) against other processes; nothing is
    locked where flock does not exist."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def sqlite_file(uri: str) -> Path | None:
    """The database file a `sqlite:///PATH[?query]` URI names; None for another store or an
    in-memory database."""
    if not uri.startswith("sqlite:///"):
        return None
    db = uri.removeprefix("sqlite:///").partition("?")[0]
    return None if db in ("", ":memory:") else Path(db)


@contextlib.contextmanager
def held(path: Path, create: bool) -> Iterator[IO[str] | None]:
    """The buffer file open and locked (flock) against the other processes that append to it
    or replay it (a training and `tibnlp runs sync`), or None when it does not exist and
    `create` is false. Without the lock, two replays of one file created its runs twice, and a
    record appended between a replay's read and its rewrite was lost. A replay replaces or
    removes the file: a process that waited for the lock then finds another file at the path,
    and takes that one. Where flock does not exist (not POSIX), nothing is locked."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        fcntl = None  # type: ignore[assignment]
    while True:
        try:
            fh = path.open("a+" if create else "r+", encoding="utf-8")
        except FileNotFoundError:
            if create:
                raise
            yield None
            return
        with fh:  # closing releases the lock
            if fcntl is None:
                yield fh
                return
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                same = os.path.samestat(os.fstat(fh.fileno()), os.stat(path))
            except FileNotFoundError:
                same = False
            if same:
                yield fh
                return


class Buffer:
    """Append-only JSONL file of records waiting for the store."""

    def __init__(self, path: Path, uri: str) -> None:
        self.path = Path(path)
        self.uri = uri

    def append(self, rec: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with held(self.path, create=True) as fh:
            assert fh is not None
            size = fh.seek(0, os.SEEK_END)
            if size == 0:  # a new file (or one a replay emptied and removed)
                fh.write(json.dumps({"op": "header", "uri": self.uri, "version": 1}) + "\n")
            elif os.pread(fh.fileno(), 1, size - 1) != b"\n":
                fh.write("\n")  # a write cut short (disk full): it must not swallow this record
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
            fh.flush()

    def __len__(self) -> int:
        return sum(1 for r in read_records(self.path) if r.get("op") != "header")

    def pending(self) -> bool:
        return self.path.exists() and len(self) > 0


def read_records(path: Path) -> list[dict[str, Any]]:
    return parse_records(path)[0]


UNSENT = ".unsent"  # beside a buffer: its lines a replay could not send and kept for repair


def unsent_path(path: Path) -> Path:
    """Where a replay of `path` keeps the lines it could not send: `NAME.jsonl.unsent` (not
    `*.jsonl`, so a folder's sync does not take it up again), or the file itself when it is one
    (a repaired `.unsent` file synced by name)."""
    path = Path(path)
    return path if path.name.endswith(UNSENT) else path.with_name(path.name + UNSENT)


@dataclass
class Damaged:
    """A line of a buffer that is no record a replay can send, as it was in the file."""

    number: int
    line: str
    why: str

    def __str__(self) -> str:
        return f"line {self.number} {self.why}: {self.line[:80]!r}"


def parse_records(path: Path, torn: bool = False) -> tuple[list[dict[str, Any]], list[str]]:
    """The records of a buffer, and its damaged lines in words (line number, start of text):
    a line that is no record of a known operation is reported, not silently lost when the
    replayed file goes. A torn last line (a crash mid-write: no newline) is no record yet, or,
    with `torn`, a damaged line (a replay holds the file's lock: no writer is mid-line)."""
    records, damaged = parse(path, torn)
    return records, [str(d) for d in damaged]


def parse(path: Path, torn: bool = False) -> tuple[list[dict[str, Any]], list[Damaged]]:
    if not Path(path).is_file():
        return [], []
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    # not `str.splitlines`: a record may hold U+2028 or U+0085 raw (ensure_ascii=False)
    lines = text_lines(text)
    records: list[dict[str, Any]] = []
    damaged: list[Damaged] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        last = number == len(lines) and not text.endswith(("\n", "\r"))
        try:
            rec = json.loads(line)
        except ValueError:
            if last and not torn:
                continue
            rec = None
        op = rec.get("op") if isinstance(rec, dict) else None
        if op == "header" or (isinstance(op, str) and op in OPS):
            records.append(rec)
        else:
            why = "is cut short (its writer stopped mid-line)" if last and rec is None else ""
            damaged.append(Damaged(number, line, why or "is no tracking record"))
    return records, damaged


def buffer_uri(path: Path) -> str | None:
    """The store a buffer's header names; None when it names none (a damaged header)."""
    for rec in read_records(path):
        if rec.get("op") == "header":
            uri = rec.get("uri")
            return uri if isinstance(uri, str) and uri.strip() else None
    return None


def is_buffer(path: Path) -> bool:
    """A file `Buffer` wrote: its first line is the header record. Anything else is never
    replayed, rewritten or removed (a replay removes a buffer once it is sent)."""
    try:
        with Path(path).open(encoding="utf-8") as fh:
            first = json.loads(fh.readline())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(first, dict) and first.get("op") == "header"


def buffer_files(target: Path) -> Iterator[Path]:
    """The buffer files of a folder in creation order (names start with a time stamp); a file
    named on its own must be one (`DataError` otherwise), other files of a folder are skipped."""
    target = Path(target)
    if target.is_file():
        if not is_buffer(target):
            raise DataError(
                f"{target} is not a tibnlp tracking buffer (its first line is no buffer "
                "header); it was left as it is",
                "name a buffer file or folder (.tibnlp/tracking-buffer by default)",
            )
        yield target
    elif target.is_dir():
        yield from (p for p in sorted(target.glob("*.jsonl")) if is_buffer(p))
