"""A fresh MLflow SQLite store in a test's folder without paying MLflow's schema migration.

Creating a SQLite store runs every MLflow migration (seconds each time); tests copy a template
built once per MLflow version instead.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import mlflow
from mlflow.tracking import MlflowClient


def _template() -> Path:
    path = Path(tempfile.gettempdir()) / f"tibnlp-mlflow-{mlflow.__version__}-{os.getuid()}.db"
    if not path.is_file():
        work = Path(tempfile.mkdtemp(prefix="tibnlp-mlflow-"))
        MlflowClient(f"sqlite:///{work / 'mlflow.db'}").search_experiments()
        os.replace(work / "mlflow.db", path.with_suffix(f".{os.getpid()}.tmp"))
        os.replace(path.with_suffix(f".{os.getpid()}.tmp"), path)
        shutil.rmtree(work, ignore_errors=True)
    return path


def sqlite_store(folder: Path, name: str = "mlflow.db") -> str:
    """URI of a new, empty MLflow store at `folder/name` (artifacts beside it in mlruns/)."""
    target = Path(folder) / name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_template(), target)
    return f"sqlite:///{target}"
