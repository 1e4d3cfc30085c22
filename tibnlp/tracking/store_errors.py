"""How a store that will not open is explained: shared by the commands that read a store
(`tracking.reading`) and by `runs sync` (`tracking.sync`), which must not import each
other."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse


def brief(exc: Exception) -> str:
    """The first sentence of an MLflow or database error, without its links and lists."""
    text = (getattr(exc, "message", None) or str(exc)).strip()
    first = text.splitlines()[0].split(". ")[0].rstrip(".") if text else type(exc).__name__
    return first if len(first) <= 300 else first[:297] + "..."


def file_store_hint(uri: str) -> str:
    """MLflow 3 refuses a folder store (`mlruns`) unless told: how to read one, not to look
    elsewhere, since the runs are there."""
    scheme = urlparse(uri).scheme
    if scheme not in ("", "file") or not Path(file_path(uri)).is_dir():
        return ""
    return (
        f"MLflow 3 reads a folder store only when told: set MLFLOW_ALLOW_FILE_STORE=true, or "
        f"migrate it once with `mlflow migrate-filestore --source {file_path(uri)} --target "
        "sqlite:///mlflow.db` and use that store (--tracking-uri sqlite:///mlflow.db; on "
        "`tibnlp finetune` or `pretrain`: --set tracking.uri=sqlite:///mlflow.db)"
    )


def file_path(uri: str) -> str:
    return urlparse(uri).path if uri.startswith("file:") else uri
