"""A small façade over MLflow with the toolkit's conventions.

- Default store: `sqlite:///mlflow.db` in the working directory; `$MLFLOW_TRACKING_URI` or the
  config's `tracking.uri` override it.
- Params are the flattened typed config; long values are truncated to MLflow's limit.
- A run can be resumed by id (pretraining `--resume` continues the same run).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mlflow
from mlflow.tracking import MlflowClient

from tibnlp.config.core import flatten

_PARAM_LIMIT = 6000


def default_tracking_uri(uri: str = "") -> str:
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db"


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
    ) -> None:
        self.enabled = enabled
        self.run_id: str | None = None
        if not enabled:
            return
        self.uri = default_tracking_uri(uri)
        mlflow.set_tracking_uri(self.uri)
        self.client = MlflowClient(self.uri)
        exp = self.client.get_experiment_by_name(experiment)
        experiment_id = exp.experiment_id if exp else self.client.create_experiment(experiment)
        if resume_run_id:
            self.run_id = resume_run_id
            self.client.update_run(resume_run_id, status="RUNNING")
        else:
            all_tags = dict(tags or {})
            if parent_run_id:
                all_tags["mlflow.parentRunId"] = parent_run_id
            run = self.client.create_run(experiment_id, run_name=run_name or None, tags=all_tags)
            self.run_id = run.info.run_id

    @property
    def _rid(self) -> str:
        assert self.run_id is not None, "tracking is disabled"
        return self.run_id

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.end("FAILED" if exc_type else "FINISHED")

    def log_params(self, params: Mapping[str, Any]) -> None:
        if not self.enabled:
            return
        flat = flatten(params)
        for key, value in flat.items():
            self.client.log_param(self._rid, key, str(value)[:_PARAM_LIMIT])

    def set_tags(self, tags: Mapping[str, str]) -> None:
        if not self.enabled:
            return
        for key, value in tags.items():
            self.client.set_tag(self._rid, key, str(value))

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if not self.enabled:
            return
        for key, value in metrics.items():
            self.client.log_metric(self._rid, key, float(value), step=step or 0)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        if not self.enabled:
            return
        path = Path(path)
        if path.is_dir():
            self.client.log_artifacts(self._rid, str(path), artifact_path)
        else:
            self.client.log_artifact(self._rid, str(path), artifact_path)

    def end(self, status: str = "FINISHED") -> None:
        if self.enabled and self.run_id:
            self.client.set_terminated(self.run_id, status=status)
