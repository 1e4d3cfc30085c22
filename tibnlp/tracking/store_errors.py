"""How a store that will not open is explained: shared by the commands that read a store
(`tracking.reading`), by `runs sync` (`tracking.sync`), which must not import each other, and
by the runs a stage or pipeline opens (`tracking.store.open_store`).

A hint names the way the command at hand sets the store: `--tracking-uri` (`runs`, `ui`,
`pipeline run`) or the config key `tracking.uri`, set with `--set` (`pretrain` and `finetune`
have no `--tracking-uri`; `pipeline run` takes both)."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

URI_OPTION = "--tracking-uri"  # the option of the commands that have one
URI_KEY = "tracking.uri"  # the config key, set with --set (the stage commands' only way)


def brief(exc: Exception) -> str:
    """The first sentence of an MLflow or database error, without its links and lists."""
    text = (getattr(exc, "message", None) or str(exc)).strip()
    first = text.splitlines()[0].split(". ")[0].rstrip(".") if text else type(exc).__name__
    return first if len(first) <= 300 else first[:297] + "..."


def use_store(uri: str, setting: str = URI_OPTION) -> str:
    """What to type to use `uri`: the option `setting` names, or its config key with --set."""
    return f"{setting} {uri}" if setting.startswith("--") else f"--set {setting}={uri}"


def uri_origin(uri: str, setting: str = URI_OPTION) -> str:
    """Where the URI came from (`uri`: as given, "" when not), so the message says what to
    change."""
    if uri:
        return f"given by {setting}" if setting.startswith("--") else f"config key '{setting}'"
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return "from $MLFLOW_TRACKING_URI"
    return "the default"


def file_store_hint(uri: str, setting: str = URI_OPTION) -> str:
    """MLflow 3 refuses a folder store (`mlruns`) unless told: how to read one, not to look
    elsewhere, since the runs are there."""
    scheme = urlparse(uri).scheme
    if scheme not in ("", "file") or not Path(file_path(uri)).is_dir():
        return ""
    return (
        f"MLflow 3 reads a folder store only when told: set MLFLOW_ALLOW_FILE_STORE=true, or "
        f"migrate it once with `mlflow migrate-filestore --source {file_path(uri)} --target "
        f"sqlite:///mlflow.db` and use that store ({use_store('sqlite:///mlflow.db', setting)})"
    )


def file_path(uri: str) -> str:
    return urlparse(uri).path if uri.startswith("file:") else uri
