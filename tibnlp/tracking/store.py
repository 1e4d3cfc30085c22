"""Which MLflow store a run goes to, and how it is reached: the default store, a SQLite file
named from any directory, short HTTP retries, a new SQLite store created once, and a store
that cannot be opened refused as a ConfigError before a stage writes anything."""

from __future__ import annotations

import contextlib
import fcntl
import os
from typing import Any

import mlflow
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from sqlalchemy.exc import SQLAlchemyError

from tibnlp.errors import ConfigError
from tibnlp.tracking.buffer import sqlite_file
from tibnlp.tracking.conventions import env_default
from tibnlp.tracking.store_errors import URI_KEY, brief, file_store_hint, uri_origin, use_store


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


def open_store(given: str, setting: str = URI_KEY) -> tuple[str, MlflowClient]:
    """The store `given` names (`default_tracking_uri`) and a client of it; a URI MLflow
    refuses (a plain path or folder: MLflow 3's folder store needs MLFLOW_ALLOW_FILE_STORE) or
    a folder that cannot be made is a ConfigError naming it and where it came from (`setting`:
    the option or config key the command sets it with), not a traceback. A server is not asked
    here: one that does not answer is an outage, buffered later."""
    uri = default_tracking_uri(given)
    short_http_retries(uri)
    failed = f"cannot open the tracking store {uri} ({uri_origin(given, setting)})"
    try:
        mlflow.set_tracking_uri(uri)
        create_sqlite_store_once(uri)
        return uri, MlflowClient(uri)
    except (MlflowException, OSError) as exc:
        raise ConfigError(
            f"{failed}: {brief(exc)}",
            file_store_hint(uri, setting)
            or f"give a SQLite file, {use_store('sqlite:///PATH/mlflow.db', setting)}, in a "
            "folder you can write to (a plain path is MLflow's folder store), or a server "
            "http://HOST:PORT",
        ) from exc
    except SQLAlchemyError as exc:  # not an MLflow database, or a database that does not answer
        raise ConfigError(
            f"{failed}: {brief(exc)}",
            f"point {setting} at an MLflow database or server: sqlite:///PATH/mlflow.db, or "
            "http://HOST:PORT",
        ) from exc
    except ImportError as exc:  # a database URI whose driver is not installed (as read_client)
        raise ConfigError(
            f"{failed}: {exc}", "install the database driver it names, or use another store"
        ) from exc


def require_store(cfg: Any) -> None:
    """Open the store a stage's `tracking` section names (nothing when tracking is off) before
    the stage tokenises or writes its output: a URI that cannot be a store is refused while the
    output folder is as it was, not once config.yaml and data/ are there. Called where the
    stage's run will be opened (rank 0 of a data-parallel run); a server that does not answer
    passes, its run buffers as at any outage."""
    if cfg.enabled:
        open_store(cfg.uri)
