"""Dotted keys in a pipeline file, as `--set` writes them: which of its mappings are keyed by
whole dotted keys (a grid's `finetune.head`, a tag `a.b`), and reading such a key back."""

from __future__ import annotations

from typing import Any

from tibnlp.config import Config
from tibnlp.config.core import key_path, whole_keys


def file_whole(path: list[str]) -> bool:
    """The mappings of a pipeline file keyed by whole dotted keys: `stages.NAME.grid`
    (`--set stages.NAME.grid.a.b=[...]` sets or adds its key `a.b`), and in the shared
    `config` or a stage's, those the config classes key so (`tracking.tags`: a tag `a.b`)."""
    if len(path) == 3 and path[0] == "stages" and path[2] == "grid":
        return True
    if path[:1] == ["config"]:
        return whole_keys(Config)(path[1:])
    return (
        len(path) > 3
        and path[0] == "stages"
        and path[2] == "config"
        and whole_keys(Config)(path[3:])
    )


_ABSENT = object()


def get_dotted(data: Any, key: str, default: Any = None) -> Any:
    """The value at a dotted key (`pretrain.max_steps`) of a config's nested mappings, else
    `default`; a key that holds dots is read as `--set` writes it (`tracking.tags.a.b`: the
    tag `a.b`, `key_path`)."""
    if not isinstance(data, dict):
        return default
    for part in key_path(data, key.split("."), whole_keys(Config)):
        if not isinstance(data, dict) or part not in data:
            return default
        data = data[part]
    return data


def has_dotted(data: Any, key: str) -> bool:
    return get_dotted(data, key, _ABSENT) is not _ABSENT
