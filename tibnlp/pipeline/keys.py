"""Dotted keys in a pipeline file, as `--set` writes them: which of its mappings are keyed by
whole dotted keys (a grid's `finetune.head`, a tag `a.b`), reading and setting such a key, and
setting one inside a stage's list of variants."""

from __future__ import annotations

import copy
from typing import Any

from tibnlp.config import Config
from tibnlp.config.core import apply_overrides, deep_merge, key_path, whole_keys
from tibnlp.errors import ConfigError


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


def set_dotted(data: dict[str, Any], key: str, value: Any, where: str) -> None:
    """Set `key` in `data`; a mapping given for a section sets those keys in it, as `--set`
    does (a variant's `set: {vocab: {seed: 1}}` keeps the stage's other vocab keys)."""
    node = data
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(
                f"{where}: '{key}' sets inside a value, not a section",
                f"'{part}' holds a value, not keys: set it as a whole, or check the key's spelling",
            )
    if isinstance(value, dict) and isinstance(node.get(parts[-1]), dict):
        node[parts[-1]] = deep_merge(node[parts[-1]], value)
    else:
        node[parts[-1]] = copy.deepcopy(value)


def set_in_variant(stages: dict[str, Any], stage: str, text: str) -> None:
    """`--set stages.S.variants.V.set.KEY=VALUE` in a pipeline file's data. The list reads
    as a mapping: V is a variant's name, or its position from 0 (an unnamed one's name is
    made from its keys, so it has none to type); KEY is whole, as the file writes it. The list
    is the stage's own: `read_yaml` copies out what a YAML alias (`variants: *common`) shares."""
    key = text.split("=", 1)[0].strip()
    prefix = f"stages.{stage}.variants"
    body = stages.get(stage)
    body = body if isinstance(body, dict) else {}
    variants = body.get("variants")
    if not isinstance(variants, list):
        grid = isinstance(body.get("grid"), dict)
        raise ConfigError(
            f"--set {key}: stage {stage} has no list of variants",
            f"its grid is set as --set stages.{stage}.grid.KEY='[VALUE, ...]'"
            if grid
            else f"give it one: --set {prefix}='[{{name: NAME, set: {{KEY: VALUE}}}}]'",
        )
    handles = {str(i): i for i in range(len(variants))}
    handles.update(
        {str(v["name"]): i for i, v in enumerate(variants) if isinstance(v, dict) and v.get("name")}
    )

    def whole(path: list[str]) -> bool:  # a variant's `set` is keyed by whole dotted keys
        return len(path) == 5 and path[4] == "set"

    view = {"stages": {stage: {"variants": {h: variants[i] for h, i in handles.items()}}}}
    path = key_path(view, key.split("."), whole)
    handle = path[3]
    if handle not in handles:
        shown = [
            str(v["name"]) if isinstance(v, dict) and v.get("name") else f"{i} (unnamed)"
            for i, v in enumerate(variants)
        ]
        raise ConfigError(
            f"--set {key}: stage {stage} has no variant {handle!r}",
            f"its variants: {', '.join(shown)}; write --set {prefix}.NAME.set.KEY=VALUE "
            "(or its position, from 0: an unnamed one has no name to write)",
        )
    if len(path) > 4 and path[4] not in ("name", "set"):
        rest = ".".join(path[4:])
        raise ConfigError(
            f"--set {key}: a variant has the keys name and set, not {path[4]!r}",
            f"to set {rest} in variant {handle}: --set {prefix}.{handle}.set.{rest}=VALUE",
        )
    box = {"stages": {stage: {"variants": {handle: variants[handles[handle]]}}}}
    apply_overrides(box, [text], whole=whole)
    variants[handles[handle]] = box["stages"][stage]["variants"][handle]
