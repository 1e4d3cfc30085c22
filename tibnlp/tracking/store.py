"""Which MLflow store a run goes to, and how it is reached: the default store, a SQLite file
named from any directory, short HTTP retries, and a new SQLite store created once."""

from __future__ import annotations

import contextlib
import fcntl
import os

from mlflow.tracking import MlflowClient

from tibnlp.tracking.buffer import sqlite_file
from tibnlp.tracking.conventions import env_default


def default_tracking_uri(uri: str = "") -> str:
    """`uri`, else `$MLFLOW_TRACKING_URI`, else `sqlite:///mlflow.db` in the working directory."""
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db"


def absolute_store(uri: str) -> str:
    """`sqlite:///mlflow.db` names a file in the working directory: a buffer records the
    absolute path, so `tibnlp runs sync` from elsewhere replays into the same store."""
    path = sqlite_file(uri)
    if path is None or path.is_absolute():
        return uri
    _, sep, query = uri.partition("?")
    return f"sqlite:///{path.resolve()}{sep}{query}"


def short_http_retries(uri: str) -> None:
    """MLflow's defaults retry for minutes; a training step should not wait that long."""
    if uri.startswith(("http://", "https://")):
        env_default("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        env_default("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
        env_default("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")


_SQLITE_READY: set[str] = set()  # stores this process has created or opened


def create_sqlite_store_once(uri: str) -> None:
    """MLflow creates a new SQLite store's tables on first use; two processes doing that at
    once (two fine-tunings started together on a fresh ./mlflow.db) fail with "table runs
    already exists". Create it under a file lock beside the database, once per process."""
    db = sqlite_file(uri)
    if db is None or uri in _SQLITE_READY:
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".init-lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        with contextlib.suppress(Exception):  # a store that cannot open fails as before
            MlflowClient(uri).search_experiments(max_results=1)
            _SQLITE_READY.add(uri)
