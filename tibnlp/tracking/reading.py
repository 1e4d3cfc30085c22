"""Opening a tracking store for a command that only reads it (`runs compare`, `runs plot`).

Reading never creates a store: MLflow makes an empty SQLite file (or mlruns folder) wherever a
URI points, so a typo, or a command run in the wrong folder, would leave a new store behind and
report "no experiment" from it. A server that does not answer fails in seconds rather than
after MLflow's minutes of retries, and a URI MLflow cannot open is a ConfigError naming it.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from urllib.parse import urlparse

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from sqlalchemy.exc import SQLAlchemyError

from tibnlp.errors import ConfigError
from tibnlp.tracking.conventions import env_default
from tibnlp.tracking.store import default_tracking_uri
from tibnlp.tracking.store_errors import brief, file_path, file_store_hint, uri_origin

HINT = (
    "point --tracking-uri (or $MLFLOW_TRACKING_URI) at an existing store: "
    "sqlite:///PATH/mlflow.db, or a tracking server http://HOST:PORT"
)


def metric_value(value: float) -> float:
    """A stored metric as logged: MLflow stores an infinite value (a diverged loss) as the
    largest float, which a mean would show as 309 digits."""
    value = float(value)
    return math.copysign(math.inf, value) if abs(value) == sys.float_info.max else value


def read_client(uri: str = "") -> MlflowClient:
    """A client of the store `uri` names (default: `default_tracking_uri`), which must exist
    and answer: checked here, once, so every later call reads a working store."""
    resolved = default_tracking_uri(uri)
    where = uri_origin(uri)
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
            f"cannot read the tracking store {resolved} ({where}): {brief(exc)}",
            file_store_hint(resolved) or HINT,
        ) from exc
    except SQLAlchemyError as exc:
        raise ConfigError(
            f"tracking store {resolved} ({where}) is not an MLflow database: {brief(exc)}", HINT
        ) from exc
    except ImportError as exc:  # a database URI whose driver is not installed
        raise ConfigError(
            f"cannot read the tracking store {resolved} ({where}): {exc}",
            "install the database driver it names, or use another store",
        ) from exc
    return client


def require_existing_store(uri: str, where: str = "") -> None:
    """A ConfigError when `uri` is a SQLite file or a store folder that does not exist (which
    MLflow would create), or an in-memory database (always empty); server and database URIs
    are left to the probe."""
    scheme = urlparse(uri).scheme
    if scheme == "sqlite":
        path = uri.removeprefix("sqlite:").removeprefix("///").partition("?")[0]
        if path in ("", "//", ":memory:"):
            raise ConfigError(
                f"the tracking store {uri} ({where}) is an in-memory database: it holds no runs",
                HINT,
            )
        if Path(path).is_dir():
            raise ConfigError(
                f"the tracking store {uri} ({where}) names the folder {Path(path).absolute()}, "
                "not a SQLite file",
                f"give the database file in it, e.g. sqlite:///{Path(path).absolute()}/mlflow.db",
            )
        if not Path(path).is_file():
            _missing(uri, where, Path(path))
    elif scheme in ("", "file"):
        folder = Path(file_path(uri))
        if folder.is_file():  # `--tracking-uri mlflow.db`: a SQLite file named as a path
            raise ConfigError(
                f"the tracking store {uri} ({where}) is a file, and a plain path names a store "
                "folder",
                f"name a SQLite store with its scheme: sqlite:///{folder.absolute()}",
            )
        if not folder.is_dir():
            _missing(uri, where, folder)


def _missing(uri: str, where: str, path: Path) -> None:
    raise ConfigError(
        f"no tracking store at {path.absolute()} ({uri}, {where}): a command that only reads "
        "runs does not create one",
        f"run it in the folder where the runs were tracked, or {HINT}",
    )
