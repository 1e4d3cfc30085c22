"""Reading config and pipeline YAML (files and `--set` values): YAML 1.2's numbers and
booleans, no duplicate keys, no shared aliases (nor aliases expanding past a limit), and
errors that name the file and line.

PyYAML's SafeLoader follows YAML 1.1, which reads `1:30` as 90 and `off` as false; a config
file must mean what it looks like, so every YAML the toolkit reads goes through `ConfigLoader`.
Turning the mappings into dataclasses is `core`'s job.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tibnlp.errors import ConfigError

_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_BOOL = "tag:yaml.org,2002:bool"
_DROPPED = (_INT, _FLOAT, _BOOL, "tag:yaml.org,2002:timestamp")
# YAML 1.1's other booleans: still true/false where a key is declared bool, but text elsewhere
# (`engine.compile: off` is the value 'off', a tag `country: NO` stays "NO")
YES_NO = {"yes": True, "on": True, "no": False, "off": False}


class ConfigLoader(yaml.SafeLoader):
    """The loader of config and pipeline files and of --set values: SafeLoader that refuses a
    key given twice in one mapping (YAML requires unique keys; PyYAML silently keeps the last,
    dropping a whole section written twice), with YAML 1.2's numbers and booleans: PyYAML
    follows YAML 1.1, where `1:30` is the base-60 int 90 (a time budget of 90 seconds), `0755`
    is octal, `2024-01-01` a date and `off` false, while `1e-3` is a string."""

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        text = str(self.construct_scalar(node))
        if text.lstrip("+-").startswith(("0o", "0x")):
            sign = -1 if text.startswith("-") else 1
            digits = text.lstrip("+-")
            return sign * int(digits[2:], 8 if digits[1] == "o" else 16)
        return int(text.replace("_", ""), 10)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: SafeLoader's own error follows
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
        return super().construct_mapping(node, deep)


ConfigLoader.yaml_implicit_resolvers = {  # YAML 1.1's numbers and dates left out
    first: [(tag, rx) for tag, rx in rules if tag not in _DROPPED]
    for first, rules in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
ConfigLoader.add_implicit_resolver(
    _INT,
    re.compile(r"^(?:[-+]?[0-9][0-9_]*|[-+]?0o[0-7]+|[-+]?0x[0-9a-fA-F]+)$"),
    list("-+0123456789"),
)
ConfigLoader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)
ConfigLoader.add_implicit_resolver(
    _BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
ConfigLoader.add_constructor(_INT, ConfigLoader.construct_yaml_int)


def parse_override(text: str) -> tuple[list[str], Any]:
    """`"model.hidden=384"` -> (["model", "hidden"], 384); the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r} has an empty key; use section.key=value")
    try:
        value = yaml.load(raw, Loader=ConfigLoader) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: value is not valid YAML ({exc})") from exc
    return key.split("."), value


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML mapping, with errors naming the file and line."""
    from tibnlp.errors import DataError

    path = Path(path)
    if path.is_dir():  # `-c configs/` exists: "does not exist" would send the user astray
        found = sorted(str(p) for p in path.glob("*.y*ml"))[:3]
        raise DataError(
            f"config file {path} is a directory",
            "give a YAML file" + (f", e.g. {', '.join(found)}" if found else ""),
        )
    if not path.exists():  # a pipe (`-c <(...)`, /dev/stdin) exists without being a file
        raise DataError(f"config file {path} does not exist", "check the path")
    try:
        text = path.read_text(encoding="utf-8")
        data = yaml.load(text, Loader=ConfigLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ConfigError(f"{where}: invalid YAML ({getattr(exc, 'problem', exc)})") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not valid UTF-8 ({exc})") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return _Unsharer(path, max(MAX_NODES, NODES_PER_CHAR * len(text))).copy(data, ())


# Without aliases a file holds fewer values than characters; an alias is copied out in full
# (`_Unsharer`), so nested aliases (`b: [*a, *a, ...]`, `c: [*b, *b, ...]`: "billion laughs")
# would grow without bound. A file may expand this far, and no further.
MAX_NODES = 100_000
NODES_PER_CHAR = 4


class _Unsharer:
    """Copies out what YAML aliases share, so that no mapping or list is shared: an alias
    (`config: *common`) gives two keys one object, so a `--set` naming one stage would change
    the other too. Counts the values as it copies and stops at `limit`, before a file of
    nested aliases takes the memory of its full expansion."""

    def __init__(self, path: Path, limit: int) -> None:
        self.path, self.limit, self.count = path, limit, 0

    def copy(self, obj: Any, within: tuple[int, ...]) -> Any:
        self.count += 1
        if self.count > self.limit:
            raise ConfigError(
                f"{self.path}: its aliases expand too far (over {self.limit:,} values)",
                "use an alias (*name) for a shared section, not aliases nested in aliases",
            )
        if not isinstance(obj, (dict, list)):
            return obj
        if id(obj) in within:
            raise ConfigError(f"{self.path}: an alias refers to a mapping or list that contains it")
        within = (*within, id(obj))
        if isinstance(obj, dict):
            return {key: self.copy(value, within) for key, value in obj.items()}
        return [self.copy(value, within) for value in obj]
