"""A small façade over MLflow with the toolkit's conventions.

- Default store: `sqlite:///mlflow.db` in the working directory; `$MLFLOW_TRACKING_URI` or the
  config's `tracking.uri` override it.
- Params are the flattened typed config; long values are truncated to MLflow's limit.
- A run can be resumed by id (pretraining `--resume` continues the same run).
- Tracking never kills training: each call is a record sent by an `outbox.Outbox`, which
  buffers it locally while the store cannot be reached and replays it when the store answers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mlflow.exceptions import MlflowException

from tibnlp.config.core import flatten
from tibnlp.errors import ConfigError
from tibnlp.stopping import ended_status
from tibnlp.tracking.buffer import (
    OFFLINE_PREFIX,
    PARENT_TAG,
    Buffer,
    IdMap,
    default_buffer_dir,
    new_local_id,
    now_ms,
)
from tibnlp.tracking.conventions import TAG_GIT_COMMIT, git_commit
from tibnlp.tracking.outbox import Outbox
from tibnlp.tracking.store import absolute_store, open_store
from tibnlp.tracking.store_errors import URI_KEY

_PARAM_LIMIT = 6000
_KEY_LIMIT = 250
_BAD_KEY = re.compile(r"[^/\w.\- :]")  # what MLflow refuses in a param name (a whole batch)
log = logging.getLogger("tibnlp.tracking")


def _param_key(name: str, unique: bool = False) -> str:
    """`name` as MLflow takes a param name: its refused characters replaced, cut to the
    limit; `unique`: ending in a hash of the whole name, for one that meets another's."""
    key = _BAD_KEY.sub("_", name)
    if not unique:
        return key[:_KEY_LIMIT]
    tail = "-" + hashlib.sha256(name.encode("utf-8")).hexdigest()[:10]
    return key[: _KEY_LIMIT - len(tail)] + tail


class PrefixedRun:
    """A tracker whose metric names carry a prefix: a phase before the main training (the
    probe of `finetune.probe_epochs`) logs `probe/...` at its own steps, so its curves do not
    overwrite the fine-tuning's at the same step numbers."""

    def __init__(self, run: Tracker | PrefixedRun, prefix: str) -> None:
        self.run, self.prefix = run, prefix

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.run.log_metrics({self.prefix + k: v for k, v in metrics.items()}, step=step)


class Tracker:
    """One MLflow run (optionally nested under a parent). Use as a context manager."""

    def __init__(
        self,
        experiment: str,
        run_name: str = "",
        uri: str = "",
        enabled: bool = True,
        parent_run_id: str | None = None,
        resume_run_id: str | None = None,
        tags: Mapping[str, str] | None = None,
        buffer_dir: Path | str | None = None,
        retry_seconds: float = 30.0,
        keep_status: bool = False,
        uri_setting: str = URI_KEY,
    ) -> None:
        """`uri_setting`: how the command sets the store, named when it cannot be opened: the
        config key `tracking.uri` (set with --set), or an option such as --tracking-uri."""
        self.enabled = enabled
        # with resume_run_id: add to a run that another process owns (a pipeline's running
        # parent) without marking it running, or ended, here
        self.keep_status = keep_status and bool(resume_run_id)
        self.run_id: str | None = None
        self.experiment = experiment
        self.ended = False
        if not enabled:
            return
        self.uri_setting = uri_setting
        self.uri, self.client = open_store(uri, uri_setting)
        self.buffer_dir = default_buffer_dir(str(buffer_dir or ""))
        self.retry_seconds = retry_seconds
        self._ids = IdMap(self.buffer_dir)
        self._check_exists(resume_run_id, "tracking.run_id")
        self._check_exists(parent_run_id, "tracking.parent_run_id")
        local_id = resume_run_id or new_local_id()
        stamp = f"{time.time_ns()}-{local_id[-12:]}"
        buffer = Buffer(self.buffer_dir / f"{stamp}.jsonl", absolute_store(self.uri))
        self._outbox = Outbox(self.uri, self.client, self._ids, buffer, retry_seconds)
        if resume_run_id:
            self.run_id = resume_run_id
            if not self.keep_status:
                self._submit({"op": "update_run", "run": resume_run_id, "status": "RUNNING"})
        else:
            self.run_id = local_id
            self._submit(
                {
                    "op": "create_run",
                    "local_id": local_id,
                    "experiment": experiment,
                    "run_name": run_name,
                    "parent": parent_run_id,
                    "tags": {TAG_GIT_COMMIT: git_commit()}
                    | {k: str(v) for k, v in (tags or {}).items()},
                    "time": now_ms(),
                }
            )

    def _check_exists(self, run_id: str | None, key: str) -> None:
        """Refuse at start a run id the store does not know: a config copied from a pipeline
        stage (OUTPUT/config.yaml) carries that stage's run, and against another store every
        later call would be rejected. An offline id or an unreachable store is left to the
        buffer, as any outage is."""
        if not run_id or run_id.startswith(OFFLINE_PREFIX) or run_id in self._ids.ids:
            return
        try:
            self.client.get_run(run_id)
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                return
            raise ConfigError(
                f"config key '{key}': run {run_id} does not exist in the tracking store "
                f"{self.uri} (a config copied from a pipeline stage names that stage's run)",
                "clear the stage's runs to start a new one: "
                "--set tracking.run_id= --set tracking.parent_run_id=",
            ) from None
        except Exception:
            return

    # -- resilience ------------------------------------------------------------------------

    @property
    def offline(self) -> bool:
        """True while calls are being buffered locally."""
        return self.enabled and self._outbox.offline

    @property
    def buffer(self) -> Buffer:
        """Where this run's calls wait while the store is away."""
        return self._outbox.buffer

    def _refresh_run_id(self) -> None:
        if self.run_id and self.run_id in self._ids.ids:
            self.run_id = self._ids.ids[self.run_id]

    def _submit(self, rec: dict[str, Any]) -> None:
        self._outbox.submit(rec)
        self._refresh_run_id()  # a run created offline has its real id once replayed

    # -- public API ------------------------------------------------------------------------

    @property
    def _rid(self) -> str:
        assert self.run_id is not None, "tracking is disabled"
        return self.run_id

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self.end(ended_status(exc))

    def child(
        self,
        run_name: str,
        tags: Mapping[str, str] | None = None,
        resume_run_id: str | None = None,
    ) -> Tracker:
        """A run nested under this one, in the same experiment, store and buffer folder
        (or, with `resume_run_id`, that earlier run continued)."""
        if not self.enabled:
            return Tracker(self.experiment, run_name, enabled=False)
        child = Tracker(
            self.experiment,
            run_name,
            uri=self.uri,
            parent_run_id=self._rid,
            resume_run_id=resume_run_id,
            tags=tags,
            buffer_dir=self.buffer_dir,
            retry_seconds=self.retry_seconds,
            uri_setting=self.uri_setting,
        )
        if resume_run_id:  # nested under this run now (an offline id is resolved on replay)
            child.set_tags({PARENT_TAG: self._rid})
        return child

    def log_params(self, params: Mapping[str, Any]) -> None:
        if not self.enabled:
            return
        flat = flatten(params)
        pairs = [[_param_key(k), str(v)[:_PARAM_LIMIT]] for k, v in flat.items()]
        taken: set[str] = set()
        for (k, _), pair in zip(flat.items(), pairs, strict=True):
            if pair[0] in taken:  # two names made one ('a,b' and 'a_b', or cut alike): the
                # store refused the whole batch as "duplicate keys", every other param with it
                pair[0] = _param_key(k, unique=True)
            taken.add(pair[0])
        renamed = [f"{k!r} as {p[0]!r}" for k, p in zip(flat, pairs, strict=True) if k != p[0]]
        if renamed:
            log.warning("tracking: run %s logs params %s", self.run_id, ", ".join(renamed))
        self._submit(
            {"op": "log_batch", "run": self._rid, "metrics": [], "params": pairs, "tags": []}
        )

    def set_tags(self, tags: Mapping[str, str]) -> None:
        if not self.enabled:
            return
        pairs = [[k, str(v)] for k, v in tags.items()]
        self._submit(
            {"op": "log_batch", "run": self._rid, "metrics": [], "params": [], "tags": pairs}
        )

    def set_experiment_tags(self, tags: Mapping[str, str]) -> None:
        """Tags of this run's experiment (`mlflow.note.content` is its description)."""
        if not self.enabled:
            return
        rec = {"op": "set_experiment_tags", "experiment": self.experiment}
        self._submit({**rec, "tags": [[k, str(v)] for k, v in tags.items()]})

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if not self.enabled:
            return
        ts = now_ms()
        rows = [[k, float(v), int(step or 0), ts] for k, v in metrics.items()]
        self._submit(
            {"op": "log_batch", "run": self._rid, "metrics": rows, "params": [], "tags": []}
        )

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        if not self.enabled:
            return
        rec = {"op": "log_artifact", "run": self._rid, "path": str(Path(path).resolve())}
        self._submit({**rec, "artifact_path": artifact_path})

    def _log_staged(self, file: Path, artifact_file: str) -> None:
        parent = str(Path(artifact_file).parent)
        rec = {"op": "log_artifact", "run": self._rid, "path": str(file.resolve()), "staged": True}
        self._submit({**rec, "artifact_path": None if parent == "." else parent})

    def log_text(self, text: str, artifact_file: str) -> None:
        """A text artifact (e.g. `reports/eval.md`)."""
        if not self.enabled:
            return
        file = self._outbox.staged(artifact_file)
        file.write_text(text, encoding="utf-8")
        self._log_staged(file, artifact_file)

    def log_dict(self, data: Any, artifact_file: str) -> None:
        """A dict as YAML or JSON artifact, by the file's extension (resolved configs, reports)."""
        if not self.enabled:
            return
        if artifact_file.endswith((".yaml", ".yml")):
            import yaml

            text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
        else:
            text = json.dumps(data, indent=2, ensure_ascii=False, default=str)
        self.log_text(text, artifact_file)

    def log_figure(self, figure: Any, artifact_file: str) -> None:
        """A matplotlib figure (learning curve, confusion matrix) as an image artifact."""
        if not self.enabled:
            return
        file = self._outbox.staged(artifact_file)
        figure.savefig(file, bbox_inches="tight", dpi=120)
        self._log_staged(file, artifact_file)

    def register_model(
        self,
        model_dir: Path,
        name: str,
        metrics: Mapping[str, float] | None = None,
        artifact_path: str = "model",
        description: str = "",
        tags: Mapping[str, str] | None = None,
        run_tags: Sequence[str] = (),
        model_description: str = "",
        unique_tag: str = "",
    ) -> None:
        """Log a model directory and register it as a new version of registered model `name`.

        The version points at the run's artifact copy; its tags carry the given metrics (also
        logged to the run) so the registry lists each version with its scores, then `tags`
        (a value naming a run created offline is replaced by its real id), and the run's own
        tags named in `run_tags` (provenance: read from the run when the version is made).
        `description` is the version's; `model_description` the registered model's, when this
        version creates it (`description` otherwise). `unique_tag`: a key of `tags` whose value
        names what is registered; when a version of `name` carries it already, none is made
        (checked when the call reaches the store, so a registration buffered while the store
        was unreachable is not made twice).
        """
        if not self.enabled:
            return
        metrics = dict(metrics or {})
        if metrics:
            self.log_metrics(metrics)
        self.log_artifact(Path(model_dir), artifact_path)
        version_tags = {k: f"{float(v):.6g}" for k, v in metrics.items()}
        version_tags.update({k: str(v) for k, v in (tags or {}).items()})
        self._submit(
            {
                "op": "register_model",
                "run": self._rid,
                "name": name,
                "artifact_path": artifact_path,
                "tags": version_tags,
                "run_tags": list(run_tags),
                "description": description,
                "model_description": model_description or description,
                "unique_tag": unique_tag,
            }
        )

    def end(self, status: str = "FINISHED") -> None:
        if not self.enabled or not self.run_id or self.ended:
            return
        if not self.keep_status:
            rec = {"op": "set_terminated", "run": self._rid, "status": status, "time": now_ms()}
            self._submit(rec)  # (sent, or kept in the buffer for `tibnlp runs sync`)
        self.ended = True  # not before: a stop inside the call leaves the run to end
        self._outbox.close()  # one last try to replay what is buffered
        self._refresh_run_id()


def tracker_from_config(
    cfg: Any, run_name: str = "", tags: Mapping[str, str] | None = None
) -> Tracker:
    """The Tracker a stage should use: `tracker_from_config(config.tracking, "pretrain")`.

    Under `tibnlp pipeline run` the config names the stage's run (`tracking.run_id`), which the
    stage then logs into; standalone it creates a run (nested under `tracking.parent_run_id`
    when set) in `tracking.experiment`.
    """
    all_tags = {**(cfg.tags or {}), **(tags or {})}
    tracker = Tracker(
        cfg.experiment,
        cfg.run_name or run_name,
        uri=cfg.uri,
        enabled=cfg.enabled,
        parent_run_id=cfg.parent_run_id or None,
        resume_run_id=cfg.run_id or None,
        tags=all_tags,
        buffer_dir=cfg.buffer_dir or None,
        retry_seconds=cfg.retry_seconds,
    )
    if cfg.run_id and all_tags:
        tracker.set_tags(all_tags)
    return tracker
