"""`tibnlp runs sync`: the buffer files of a folder (or one file) replayed into their stores,
each as far as its store allows, and why the calls left wait (`SyncResult`).

Its own module, above `tracking.replay` (one file's replay, which a run's `Outbox` uses live)
and `tracking.tracker` (whose store settings it opens each store with).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mlflow.tracking import MlflowClient

from tibnlp.errors import ConfigError, DataError
from tibnlp.tracking.buffer import (
    OFFLINE_ID,
    TAG_LOCAL_ID,
    UNSENT,
    DamagedIds,
    IdMap,
    PendingParent,
    buffer_files,
    buffer_uri,
    default_buffer_dir,
    is_buffer,
    is_outage,
    parse,
)
from tibnlp.tracking.replay import Applier, Replayed, replay
from tibnlp.tracking.store import default_tracking_uri, short_http_retries


@dataclass
class SyncResult:
    """What `sync_buffers` did: calls sent, buffer files left, calls the store refused (not
    sent, with why), why the calls left wait (an outage, or a parent run not replayed yet),
    damaged lines, artifacts whose file is gone, the `.unsent` files where those not sent
    are kept, calls that wait on a run no later sync can find without help (`lost`), and the
    `*.jsonl` files of the folder that are no buffer (`skipped`)."""

    sent: int = 0
    left: int = 0
    dropped: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    damaged: list[str] = field(default_factory=list)  # lines no replay can send
    missing: list[str] = field(default_factory=list)  # artifacts whose file is gone
    unsent: list[Path] = field(default_factory=list)  # where dropped and damaged ones are kept
    lost: list[str] = field(default_factory=list)  # waiting on a run nothing here creates
    skipped: list[Path] = field(default_factory=list)
    buffers: int = 0  # buffer files found


def _sync_applier(store: str, ids: IdMap, path: Path) -> Applier | BaseException:
    """An Applier on `store`, or the outage that keeps `path` waiting (a locked SQLite file
    fails as MLflow opens it); a store that cannot be one is a ConfigError, the file kept."""
    from tibnlp.tracking.store_errors import brief, file_store_hint

    try:
        return Applier(MlflowClient(store), ids)
    except Exception as exc:
        if is_outage(exc):
            return exc
        raise ConfigError(
            f"cannot replay {path} into the tracking store {store}: {brief(exc)}; the buffer "
            "is kept as it is",
            file_store_hint(store)
            or "replay into another store with --tracking-uri sqlite:///PATH/mlflow.db or "
            "http://HOST:PORT",
        ) from exc


def sync_buffers(target: Path | None = None, uri: str = "") -> SyncResult:
    """Replay buffer files (a file or a folder of them), each as far as the store allows.

    Refused (`DamagedIds`, nothing sent) when the folder's `ids.json` is damaged. A file that
    waits on a run created by a file replayed after it is replayed again; once a store did not
    answer, its other files wait without a try each (each try waits for the store)."""
    folder = Path(target) if target else default_buffer_dir()
    home = folder if folder.is_dir() else folder.parent
    result = SyncResult()
    if folder.is_dir():
        result.skipped = [p for p in sorted(folder.glob("*.jsonl")) if not is_buffer(p)]
    ids = IdMap(home)
    appliers: dict[str, Applier | BaseException] = {}
    paths = list(buffer_files(folder))
    result.buffers = len(paths)
    stores = {path: uri or buffer_uri(path) for path in paths}
    unnamed = [str(path) for path, store in stores.items() if not store]
    if unnamed:  # checked before any is replayed: the default store may be another one
        raise DataError(
            f"the header (line 1) of {', '.join(unnamed)} names no tracking store (a damaged "
            "buffer); nothing was replayed",
            "name the store its runs belong to: tibnlp runs sync BUFFER --tracking-uri "
            "sqlite:///PATH/mlflow.db (or http://HOST:PORT)",
        )
    if paths:
        try:
            ids.check()
        except DamagedIds as exc:  # before anything is sent: no run is created twice
            needed = ", ".join(
                f"{run} (named in {f.name})" for run, f in unmapped(home, ids).items()
            )
            raise DamagedIds(exc.path, exc.why, needed) from None
    last: dict[Path, Replayed] = {}
    todo = paths
    while todo:
        before = result.sent
        for path in todo:
            last[path] = _sync_one(path, default_tracking_uri(stores[path] or ""), ids, appliers)
            _count(result, path, last[path])
        # a file that waited on a run whose create_run was sent since: again
        todo = [p for p in todo if _pending(last[p])] if result.sent > before else []
    for path, done in last.items():
        _say_waiting(result, path, done, home, ids)
    return result


def _sync_one(
    path: Path, store: str, ids: IdMap, appliers: dict[str, Applier | BaseException]
) -> Replayed:
    """Replay one buffer file into `store` (its Applier, or its outage, kept in `appliers`)."""
    short_http_retries(store)
    if store not in appliers:  # a store that did not open is not tried again per file
        appliers[store] = _sync_applier(store, ids, path)
    applier = appliers[store]
    if isinstance(applier, BaseException):
        return Replayed(waiting=applier, store=store)
    done = replay(path, applier)
    done.store = store
    if done.waiting is not None and not isinstance(done.waiting, PendingParent):
        appliers[store] = done.waiting  # away (or ids.json damaged): its other files wait
    return done


def _pending(done: Replayed) -> bool:
    return isinstance(done.waiting, PendingParent)


def _count(result: SyncResult, path: Path, done: Replayed) -> None:
    result.sent += done.sent
    result.dropped += [f"{path.name}: {why}" for why in done.refused]
    result.damaged += [f"{path.name}: {why}" for why in done.damaged]
    result.missing += [f"{path.name}: {why}" for why in done.missing]
    if done.unsent is not None and done.unsent not in result.unsent:
        result.unsent.append(done.unsent)


def _say_waiting(result: SyncResult, path: Path, done: Replayed, home: Path, ids: IdMap) -> None:
    """Why `path` is left: an outage (sync again later), or a run that only the user can
    bring back (`lost`: its create_run is kept in a `.unsent` file, or no file creates it)."""
    why = done.waiting
    if why is None:
        return
    result.left += 1
    if isinstance(why, DamagedIds):
        result.lost.append(f"{path.name}: {why.message}")
    elif isinstance(why, PendingParent):
        run = str(why.args[0]) if why.args else "?"
        made = creators(home).get(run)
        if made is not None and made.suffix == ".jsonl":
            result.waiting.append(
                f"{path.name}: run {run} is created in {made.name}, not replayed yet"
            )
        elif made is not None:
            result.lost.append(
                f"{path.name}: run {run} is created by a call kept in {made.name}: repair "
                f"and sync that file first"
            )
        else:
            result.lost.append(
                f"{path.name}: run {run} was created by a buffer no longer in {home}, and "
                f"{ids.path} does not map it to its run in the store (and no run there is "
                f"tagged {TAG_LOCAL_ID}={run}): its calls cannot be sent"
            )
    else:
        result.waiting.append(
            f"{path.name}: the store {done.store or '?'} did not answer ({_outage_reason(why)})"
        )


def _outage_reason(exc: BaseException) -> str:
    """What an outage comes down to: MLflow wraps the socket's error ("Connection refused",
    "Read timed out") at the end of a long line about retries, past any sensible cut."""
    text = (str(exc).splitlines() or [""])[0]
    if "Caused by" in text:
        text = text.rsplit(": ", 1)[-1].rstrip("\"')")
    return f"{type(exc).__name__}: {text[:160]}"


def local_ids(path: Path) -> tuple[set[str], set[str]]:
    """The offline run ids a buffer file creates, and all those it names (its own too)."""
    if not Path(path).is_file():
        return set(), set()
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    made = {
        r["local_id"]
        for r in parse(path)[0]
        if r.get("op") == "create_run" and isinstance(r.get("local_id"), str)
    }
    return made, set(OFFLINE_ID.findall(text))


def creators(folder: Path) -> dict[str, Path]:
    """offline id -> the file of `folder` that creates its run: a buffer, or a `.unsent`
    file where a replay kept its `create_run`."""
    found: dict[str, Path] = {}
    for path in _kept_buffers(folder):
        found.update(dict.fromkeys(local_ids(path)[0], path))
    return found


def unmapped(folder: Path, ids: IdMap) -> dict[str, Path]:
    """The offline ids the buffers of `folder` name that no file there creates and `ids` does
    not map (their runs were made by buffers replayed and gone), with a file naming each."""
    made = creators(folder)
    needed: dict[str, Path] = {}
    for path in _kept_buffers(folder):
        for run in sorted(local_ids(path)[1] - made.keys() - ids.ids.keys()):
            needed.setdefault(run, path)
    return needed


def _kept_buffers(folder: Path) -> list[Path]:
    """The buffers of `folder` and the `.unsent` files replays kept beside them."""
    paths = sorted(Path(folder).glob("*.jsonl")) + sorted(Path(folder).glob("*" + UNSENT))
    return [path for path in paths if is_buffer(path)]
