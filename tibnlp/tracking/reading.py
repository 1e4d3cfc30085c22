"""Opening a tracking store for a command that only reads it (`runs compare`, `runs plot`).

Reading never creates a store: MLflow makes an empty SQLite file (or mlruns folder) wherever a
URI points, so a typo, or a command run in the wrong folder, would leave a new store behind and
report "no experiment" from it. A server that does not answer fails in seconds rather than
after MLflow's minutes of retries, and a URI MLflow cannot open is a ConfigError naming it.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from sqlalchemy.exc import SQLAlchemyError

from tibnlp.errors import ConfigError
from tibnlp.tracking.conventions import env_default
from tibnlp.tracking.tracker import default_tracking_uri

HINT = (
    "point --tracking-uri (or $MLFLOW_TRACKING_URI) at an existing store: "
    "sqlite:///PATH/mlflow.db, or a tracking server http://HOST:PORT"
)


def read_client(uri: str = "") -> MlflowClient:
    """A client of the store `uri` names (default: `default_tracking_uri`), which must exist
    and answer: checked here, once, so every later call reads a working store."""
    resolved = default_tracking_uri(uri)
    where = _origin(uri)
    require_existing_store(resolved, where)
    if resolved.startswith(("http://", "https://")):  # MLflow's defaults retry for minutes
        env_default("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
        env_default("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
        env_default("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    try:
        client = MlflowClient(resolved)
        client.search_experiments(max_results=1)
    except MlflowException as exc:
        raise ConfigError(
            f"cannot read the tracking store {resolved} ({where}): {_brief(exc)}", HINT
        ) from exc
    except SQLAlchemyError as exc:
        raise ConfigError(
            f"tracking store {resolved} ({where}) is not an MLflow database: {_brief(exc)}", HINT
        ) from exc
    except ImportError as exc:  # a database URI whose driver is not installed
        raise ConfigError(
            f"cannot read the tracking store {resolved} ({where}): {exc}",
            "install the database driver it names, or use another store",
        ) from exc
    return client


def require_existing_store(uri: str, where: str = "") -> None:
    """A ConfigError when `uri` is a SQLite file or a store folder that does not exist (which
    MLflow would create); server and database URIs are left to the probe."""
    scheme = urlparse(uri).scheme
    if scheme == "sqlite":
        path = uri.removeprefix("sqlite:///").partition("?")[0]
        if path not in ("", ":memory:") and not Path(path).is_file():
            _missing(uri, where, Path(path))
    elif scheme in ("", "file"):
        path = urlparse(uri).path if scheme == "file" else uri
        if not Path(path).is_dir():
            _missing(uri, where, Path(path))


def _missing(uri: str, where: str, path: Path) -> None:
    raise ConfigError(
        f"no tracking store at {path.absolute()} ({uri}, {where}): a command that only reads "
        "runs does not create one",
        f"run it in the folder where the runs were tracked, or {HINT}",
    )


def _origin(uri: str) -> str:
    """Where the URI came from, so the message says what to change."""
    if uri:
        return "given by --tracking-uri"
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return "from $MLFLOW_TRACKING_URI"
    return "the default"


def _brief(exc: Exception) -> str:
    """The first sentence of an MLflow or database error, without its links and lists."""
    text = (getattr(exc, "message", None) or str(exc)).strip()
    first = text.splitlines()[0].split(". ")[0].rstrip(".") if text else type(exc).__name__
    return first if len(first) <= 300 else first[:297] + "..."
