"""The replay of buffered calls into a store: `Applier` sends one record (live from
`Tracker`, and from a buffer), `replay` sends a buffer file in order and keeps what it could not
send (`.unsent`).

Its own module, apart from `tracking.sync` (every buffer of a folder, `tibnlp runs sync`):
`Tracker` applies and replays with these, while the folder's sync opens stores with
`Tracker`'s settings; in one module, `tracker` and that module would import each other.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from tibnlp.errors import DataError
from tibnlp.fsutil import atomic_write_text
from tibnlp.tracking.buffer import (
    OFFLINE_ID,
    PARENT_TAG,
    TAG_LOCAL_ID,
    DamagedIds,
    IdMap,
    PendingParent,
    held,
    is_outage,
    parse,
    sqlite_file,
    unsent_path,
)

# MLflow 3 opens an experiment without this tag on its GenAI trace overview, where tibnlp's
# runs are not shown; training experiments open on the runs table
KIND = {"mlflow.experimentKind": "custom_model_development"}
_BATCH = 100  # MLflow accepts at most 100 params / 1000 metrics per log_batch
log = logging.getLogger("tibnlp.tracking")
_SAID: set[Path] = set()  # damaged `ids.json` files already reported by this process


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


class MissingFile(DataError):
    """A buffered artifact whose file is gone: not sent, though the store did not refuse it."""


class Applier:
    """Applies records to one MLflow store (used live and by replay: one code path)."""

    def __init__(self, client: MlflowClient, ids: IdMap) -> None:
        self.client = client
        self.ids = ids
        self._experiments: dict[str, str] = {}
        self.replaying = False
        self.folder: Path | None = None  # replaying: the buffer file's folder

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
        if not OFFLINE_ID.fullmatch(local_id):  # a damaged record: no filter from it
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
        run, path = self._run(rec), self._local(rec)
        if not path.exists() and rec.get("staged") and self._uploaded(run, rec):
            return  # its copy goes once uploaded: a replay stopped before its bookkeeping
        if not path.exists():  # not an OSError: a local file gone is no store outage
            raise MissingFile(
                f"artifact {path} no longer exists (moved or deleted after it was buffered); "
                "nothing was uploaded"
            )
        if path.is_dir():
            self.client.log_artifacts(run, str(path), rec.get("artifact_path"))
        else:
            self.client.log_artifact(run, str(path), rec.get("artifact_path"))
        if rec.get("staged"):  # a copy of its own (`Outbox.staged`): FOLDER/NAME
            shutil.rmtree(path.parent, ignore_errors=True)

    def _local(self, rec: dict[str, Any]) -> Path:
        """Where `rec`'s file is. A staged copy is buffered relative to its buffer's folder
        (`files/staged-X/NAME`: the folder may be carried to another machine and synced
        there); one buffered by its absolute path (before) is looked for in that folder too
        once that path is gone."""
        path = Path(rec["path"])
        if not rec.get("staged") or self.folder is None:
            return path
        if not path.is_absolute():
            return self.folder / path
        moved = self.folder / "files" / path.parent.name / path.name
        return moved if not path.exists() and moved.exists() else path

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
        if self._held_already(name, rec.get("unique_tag") or "", rec.get("tags") or {}):
            return  # what it names is registered already (a rerun's registration)
        tags = {k: run.data.tags[k] for k in rec.get("run_tags") or () if k in run.data.tags}
        for key, value in (rec.get("tags") or {}).items():
            offline = OFFLINE_ID.fullmatch(value)  # a run created offline: its real id
            tags[key] = (self.resolve(value) or value) if offline else value
        self.client.create_model_version(
            name,
            source,
            run_id=run_id,
            tags=tags or None,
            description=rec.get("description") or None,
        )

    def _held_already(self, name: str, key: str, tags: dict[str, str]) -> bool:
        """Whether a version of `name` carries `tags[key]` under `key` (filtered by the
        store: one version at most comes back, however many there are)."""
        value = tags.get(key) if key else None
        if not value or "'" in value or "'" in name or "`" in key:
            return False  # (nothing to match, or not to be put in a filter: register)
        query = f"name='{name}' AND tags.`{key}` = '{value}'"
        return bool(self.client.search_model_versions(query, max_results=1))

    def _op_set_experiment_tags(self, rec: dict[str, Any]) -> None:
        experiment = self.experiment_id(rec["experiment"])
        for key, value in rec["tags"]:
            self.client.set_experiment_tag(experiment, key, value)

    def _op_set_terminated(self, rec: dict[str, Any]) -> None:
        self.client.set_terminated(self._run(rec), status=rec["status"], end_time=rec.get("time"))


@dataclass
class Replayed:
    """What one `replay` did: records sent, records the store refused (dropped, with why) and
    the outage the rest waits on (None when nothing is left). Damaged lines, refused records
    and artifacts whose file is gone are not sent: they are kept in `unsent` (a buffer file to
    repair and sync)."""

    sent: int = 0
    refused: list[str] = field(default_factory=list)
    waiting: BaseException | None = None
    damaged: list[str] = field(default_factory=list)  # lines or records no replay can send
    missing: list[str] = field(default_factory=list)  # artifacts whose file is gone
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
    records, bad = parse(path, torn=True)
    header = [r for r in records if r.get("op") == "header"]
    todo = [r for r in records if r.get("op") != "header"]
    out = Replayed(damaged=[str(d) for d in bad])
    unsent = [d.line for d in bad]  # as they were in the file
    pos = 0  # the first record not handled yet: kept from here on, whatever stops the loop
    applier.replaying = True
    applier.folder = path.resolve().parent
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
                elif isinstance(exc, MissingFile):
                    out.missing.append(f"{todo[pos].get('op')}: {exc}")
                else:
                    out.refused.append(f"{todo[pos].get('op')}: {exc}")
                unsent.append(json.dumps(todo[pos], ensure_ascii=False))
            else:
                out.sent += 1
            pos += 1
    finally:
        applier.replaying = False
        applier.folder = None
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
