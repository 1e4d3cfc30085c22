"""The offline buffer: every tracking call as one JSON line, replayed when the server is back.

A record is a self-contained operation (`create_run`, `log_batch`, `log_artifact`,
`register_model`, `update_run`, `set_terminated`) with its original timestamps, so a replay
writes exactly what would have been written live. Runs created while the server was away get
a local id (`offline-...`); replay maps them to real ids and remembers the mapping in
`ids.json` beside the buffers, so nested runs buffered in other files resolve their parent.
Every run also carries its local id as a tag (`TAG_LOCAL_ID`): a replayed `create_run` whose
answer was lost, or whose mapping is, finds its run instead of making a second one. A damaged
`ids.json` is never read as empty nor overwritten: it stops the replay (`DamagedIds`).

Metric records keep their original timestamp: MLflow's SQL store treats (key, step,
timestamp, value) as one row, so a record replayed twice (the server took it but the answer
was lost) is still stored once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from tibnlp.errors import DataError
from tibnlp.fsutil import atomic_write_text, text_lines

OFFLINE_PREFIX = "offline-"
PARENT_TAG = "mlflow.parentRunId"
IDS_FILE = "ids.json"
# on every run tibnlp creates: its local id, so a replayed `create_run` whose answer was lost
# (or whose `ids.json` entry is) finds the run it made instead of making a second one
TAG_LOCAL_ID = "tibnlp.local_id"
_OFFLINE_ID = re.compile(re.escape(OFFLINE_PREFIX) + "[0-9a-f]{32}")  # `new_local_id`
# MLflow 3 opens an experiment without this tag on its GenAI trace overview, where tibnlp's
# runs are not shown; training experiments open on the runs table
KIND = {"mlflow.experimentKind": "custom_model_development"}
_BATCH = 100  # MLflow accepts at most 100 params / 1000 metrics per log_batch
log = logging.getLogger("tibnlp.tracking")
_SAID: set[Path] = set()  # damaged `ids.json` files already reported by this process


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


def artifact_location(uri: str, experiment: str) -> str | None:
    """Where a new experiment of a SQLite store keeps its artifacts: `mlruns/NAME` beside the
    database file. MLflow's default is `./mlruns` of the process's working directory, so one
    store's artifacts landed wherever each command happened to run (and the test suite's in
    the checkout). A server or a database server keeps its own default (None)."""
    db = sqlite_file(uri)
    if db is None:
        return None
    # one plain path component whatever the name holds (MLflow decodes %-escapes); names
    # that meet in one folder still keep their runs apart (one folder per run id)
    folder = re.sub(r"[^\w.-]", "_", experiment, flags=re.ASCII)
    if set(folder) <= {"."}:  # "", "." or ".." would name this folder or the one above
        folder = "_" + folder
    return str(db.resolve().parent / "mlruns" / folder)


class Applier:
    """Applies records to one MLflow store (used live and by replay: one code path)."""

    def __init__(self, client: MlflowClient, ids: IdMap) -> None:
        self.client = client
        self.ids = ids
        self._experiments: dict[str, str] = {}
        self.replaying = False

    def experiment_id(self, name: str) -> str:
        if name not in self._experiments:
            exp = self.client.get_experiment_by_name(name)
            if exp is not None and exp.lifecycle_stage == "deleted":
                self.client.restore_experiment(exp.experiment_id)
            if exp is None:
                self._experiments[name] = self.client.create_experiment(
                    name,
                    artifact_location=artifact_location(self.client.tracking_uri, name),
                    tags=KIND,
                )
            else:
                if not KIND.keys() <= exp.tags.keys():  # made before tibnlp set it
                    for key, value in KIND.items():
                        self.client.set_experiment_tag(exp.experiment_id, key, value)
                self._experiments[name] = exp.experiment_id
        return self._experiments[name]

    def apply(self, rec: dict[str, Any]) -> None:
        getattr(self, "_op_" + rec["op"])(rec)

    def _run(self, rec: dict[str, Any]) -> str:
        run = self.resolve(rec["run"])
        assert run is not None
        return run

    def resolve(self, run_id: str | None) -> str | None:
        """The real id of `run_id`; replaying, a run created offline whose mapping is not in
        `ids.json` (lost, or the file moved away) is looked up in the store by its tag."""
        try:
            return self.ids.resolve(run_id)
        except PendingParent:
            found = self.find_local(str(run_id)) if self.replaying else None
            if found is None:
                raise
            self.ids.add(str(run_id), found, persist=True)
            return found

    def find_local(self, local_id: str, experiment: str | None = None) -> str | None:
        """The run tibnlp created for `local_id` (its tag `TAG_LOCAL_ID`), in `experiment`'s
        id or any experiment; None when there is none."""
        if not _OFFLINE_ID.fullmatch(local_id):  # a damaged record: no filter from it
            return None
        if experiment is not None:
            ids = [experiment]
        else:
            ids = [e.experiment_id for e in self.client.search_experiments()]
        if not ids:
            return None
        runs = self.client.search_runs(ids, f"tags.`{TAG_LOCAL_ID}` = '{local_id}'", max_results=1)
        return runs[0].info.run_id if runs else None

    def _op_header(self, rec: dict[str, Any]) -> None:
        pass

    def _op_create_run(self, rec: dict[str, Any]) -> None:
        local = rec["local_id"]
        if self.replaying:
            # re-read (another process's replay may have made it); and its id must be kept
            # for the other buffers: not into a damaged ids.json
            self.ids.check()
        if local in self.ids.ids:
            return  # created by an earlier replay whose bookkeeping was interrupted
        tags = dict(rec.get("tags") or {}) | {TAG_LOCAL_ID: local}
        parent = self.resolve(rec.get("parent"))
        if parent:
            tags[PARENT_TAG] = parent
        experiment = self.experiment_id(rec["experiment"])
        # replayed: made already when the store took the call but its answer was lost
        found = self.find_local(local, experiment) if self.replaying else None
        if found is None:
            run = self.client.create_run(
                experiment,
                run_name=rec.get("run_name") or None,
                start_time=rec.get("time"),
                tags=tags,
            )
            found = run.info.run_id
        self.ids.add(local, found, persist=self.replaying)

    def _op_update_run(self, rec: dict[str, Any]) -> None:
        self.client.update_run(self._run(rec), status=rec["status"])

    def _op_log_batch(self, rec: dict[str, Any]) -> None:
        run = self._run(rec)
        metrics = [Metric(k, float(v), int(ts), int(step)) for k, v, step, ts in rec["metrics"]]
        params = [Param(k, v) for k, v in rec["params"]]
        # a parent tag may name a run created offline: its real id, once that is replayed
        tags = [RunTag(k, (self.resolve(v) or v) if k == PARENT_TAG else v) for k, v in rec["tags"]]
        for i in range(0, max(len(metrics), len(params), len(tags)), _BATCH):
            self.client.log_batch(
                run,
                metrics=metrics[i : i + _BATCH],
                params=params[i : i + _BATCH],
                tags=tags[i : i + _BATCH],
                synchronous=True,
            )

    def _op_log_artifact(self, rec: dict[str, Any]) -> None:
        run, path = self._run(rec), Path(rec["path"])
        if not path.exists() and rec.get("staged") and self._uploaded(run, rec):
            return  # its copy goes once uploaded: a replay stopped before its bookkeeping
        if not path.exists():  # not an OSError: a local file gone is no store outage
            raise DataError(
                f"artifact {path} no longer exists (moved or deleted after it was buffered); "
                "nothing was uploaded"
            )
        if path.is_dir():
            self.client.log_artifacts(run, str(path), rec.get("artifact_path"))
        else:
            self.client.log_artifact(run, str(path), rec.get("artifact_path"))
        if rec.get("staged"):  # a copy of its own (`Tracker._staged`): FOLDER/NAME
            shutil.rmtree(path.parent, ignore_errors=True)

    def _uploaded(self, run: str, rec: dict[str, Any]) -> bool:
        """Whether `run` holds the file `rec` uploads. (A folder's files are uploaded under
        `artifact_path` with their own names: a gone folder cannot be told, and is not.)"""
        folder = rec.get("artifact_path") or None
        path = "/".join(filter(None, [folder, Path(rec["path"]).name]))
        return any(a.path == path and not a.is_dir for a in self.client.list_artifacts(run, folder))

    def _op_register_model(self, rec: dict[str, Any]) -> None:
        run_id = self._run(rec)
        name = rec["name"]
        run = self.client.get_run(run_id)
        folder = rec["artifact_path"]
        if not self.client.list_artifacts(run_id, folder):
            # its upload failed (refused, or its files gone before a replay): a version
            # would point at nothing, and `models:/NAME/N` download an empty folder
            raise DataError(
                f"run {run_id} has no artifacts under '{folder}': model '{name}' is not "
                "registered from it"
            )
        try:
            self.client.get_registered_model(name)
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            about = rec.get("model_description", rec.get("description")) or None
            try:
                self.client.create_registered_model(name, description=about)
            except MlflowException as race:  # another run created it meanwhile
                if race.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
        source = f"{run.info.artifact_uri.rstrip('/')}/{folder}"
        for version in self.client.search_model_versions(f"name='{name}'"):
            if version.run_id == run_id and version.source == source:
                return  # already registered (replay after a lost answer)
        tags = {k: run.data.tags[k] for k in rec.get("run_tags") or () if k in run.data.tags}
        for key, value in (rec.get("tags") or {}).items():
            offline = _OFFLINE_ID.fullmatch(value)  # a run created offline: its real id
            tags[key] = (self.resolve(value) or value) if offline else value
        self.client.create_model_version(
            name,
            source,
            run_id=run_id,
            tags=tags or None,
            description=rec.get("description") or None,
        )

    def _op_set_experiment_tags(self, rec: dict[str, Any]) -> None:
        experiment = self.experiment_id(rec["experiment"])
        for key, value in rec["tags"]:
            self.client.set_experiment_tag(experiment, key, value)

    def _op_set_terminated(self, rec: dict[str, Any]) -> None:
        self.client.set_terminated(self._run(rec), status=rec["status"], end_time=rec.get("time"))


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
    records, damaged = _parse(path, torn)
    return records, [str(d) for d in damaged]


def _parse(path: Path, torn: bool = False) -> tuple[list[dict[str, Any]], list[Damaged]]:
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
        if op == "header" or (isinstance(op, str) and hasattr(Applier, "_op_" + op)):
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


@dataclass
class Replayed:
    """What one `replay` did: records sent, records the store refused (dropped, with why) and
    the outage the rest waits on (None when nothing is left). Damaged lines and refused
    records are not sent: they are kept in `unsent` (a buffer file to repair and sync)."""

    sent: int = 0
    refused: list[str] = field(default_factory=list)
    waiting: BaseException | None = None
    damaged: list[str] = field(default_factory=list)  # lines or records no replay can send
    unsent: Path | None = None  # where the damaged and refused ones are kept (None: none)
    store: str = ""  # the store replayed into (set by `sync_buffers`)


def replay(path: Path, applier: Applier) -> Replayed:
    """Apply a buffer's records in order; keep (atomically rewrite) what could not be sent.

    A record the store refuses is not retried (it would block the file forever) and reported;
    the first outage stops the replay, so order is preserved. The file goes when nothing is
    left. Damaged lines and refused records are kept in `unsent_path(path)`, never lost unsaid.
    """
    with held(Path(path), create=False) as fh:
        return _replay(Path(path), applier) if fh is not None else Replayed()


def _replay(path: Path, applier: Applier) -> Replayed:
    """`replay` with the file held."""
    records, bad = _parse(path, torn=True)
    header = [r for r in records if r.get("op") == "header"]
    todo = [r for r in records if r.get("op") != "header"]
    out = Replayed(damaged=[str(d) for d in bad])
    unsent = [d.line for d in bad]  # as they were in the file
    pos = 0  # the first record not handled yet: kept from here on, whatever stops the loop
    applier.replaying = True
    try:
        while pos < len(todo):
            try:
                applier.apply(todo[pos])
            except Exception as exc:
                if is_outage(exc):
                    out.waiting = exc
                    _say_damaged(exc)
                    break
                if isinstance(exc, (KeyError, TypeError, ValueError)):  # a field gone or garbled
                    out.damaged.append(f"a {todo[pos]['op']} record is damaged ({exc!r})")
                else:
                    out.refused.append(f"{todo[pos].get('op')}: {exc}")
                unsent.append(json.dumps(todo[pos], ensure_ascii=False))
            else:
                out.sent += 1
            pos += 1
    finally:
        applier.replaying = False
        rest = [json.dumps(r, ensure_ascii=False) for r in todo[pos:]]
        keep = unsent_path(path)
        if unsent and keep != path:  # kept before the buffer that holds them goes
            _keep_unsent(keep, header, unsent)
            out.unsent = keep
        elif unsent:  # a `.unsent` file synced by name: what is still unsent stays in it
            rest = unsent + rest
            out.unsent = keep
        if rest:
            lines = [json.dumps(r, ensure_ascii=False) for r in header] + rest
            atomic_write_text(path, "".join(line + "\n" for line in lines))
        else:
            Path(path).unlink(missing_ok=True)
    return out


def _say_damaged(exc: BaseException) -> None:
    """Log a damaged `ids.json` once (a live tracker retries its replay, each time held)."""
    if isinstance(exc, DamagedIds) and exc.path not in _SAID:
        _SAID.add(exc.path)
        log.warning("tracking: buffered calls are kept: %s", exc)


def _keep_unsent(keep: Path, header: list[dict[str, Any]], lines: list[str]) -> None:
    """Add `lines` to the `.unsent` file `keep` (a buffer: the header first, so it can be
    repaired and synced by name)."""
    old = keep.read_text(encoding="utf-8", errors="replace") if keep.is_file() else ""
    if old and not old.endswith("\n"):
        old += "\n"
    if not old:
        old = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in header[:1])
    atomic_write_text(keep, old + "".join(line + "\n" for line in lines))


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


def local_ids(path: Path) -> tuple[set[str], set[str]]:
    """The offline run ids a buffer file creates, and all those it names (its own too)."""
    if not Path(path).is_file():
        return set(), set()
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    made = {
        r["local_id"]
        for r in _parse(path)[0]
        if r.get("op") == "create_run" and isinstance(r.get("local_id"), str)
    }
    return made, set(_OFFLINE_ID.findall(text))


def creators(folder: Path) -> dict[str, Path]:
    """offline id -> the file of `folder` that creates its run: a buffer, or a `.unsent`
    file where a replay kept its `create_run`."""
    found: dict[str, Path] = {}
    for path in sorted(Path(folder).glob("*.jsonl")) + sorted(Path(folder).glob("*" + UNSENT)):
        if is_buffer(path):
            found.update(dict.fromkeys(local_ids(path)[0], path))
    return found


def unmapped(folder: Path, ids: IdMap) -> dict[str, Path]:
    """The offline ids the buffers of `folder` name that no file there creates and `ids` does
    not map (their runs were made by buffers replayed and gone), with a file naming each."""
    made = creators(folder)
    needed: dict[str, Path] = {}
    for path in sorted(Path(folder).glob("*.jsonl")) + sorted(Path(folder).glob("*" + UNSENT)):
        if is_buffer(path):
            for run in sorted(local_ids(path)[1] - made.keys() - ids.ids.keys()):
                needed.setdefault(run, path)
    return needed
