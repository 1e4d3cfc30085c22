"""Typed configuration: mappings -> dataclasses, `--set key=value` overrides, validation at load.

Every component declares its settings as a dataclass whose field types are the schema. This
module turns nested mappings (from YAML, read by `yaml_loader`, or overrides) into those
dataclasses and rejects anything it cannot type-check, naming the dotted key, the value and
what is allowed, so a typo in `pipelines/*.yaml` fails at load, not an hour into a run.

Supported field types: bool, int, float, str, `Literal[...]`, `X | None`, unions of scalars
(e.g. `int | Literal["auto"]`), `list[X]`, `tuple[X, ...]`, `dict[str, X]` and nested dataclasses.
A dataclass may define `MOVED = {"old_key": "section.new_key"}` (a ClassVar): a config that
still uses an old key gets an error naming the new one.
A dataclass may define `validate(self, prefix: str) -> None` for range checks; it is called
after its fields are converted (see `check`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import yaml

from tibnlp.config.yaml_loader import YES_NO, parse_override, read_yaml
from tibnlp.errors import ConfigError
from tibnlp.fsutil import atomic_write_text

T = TypeVar("T")

_NONE_TYPE = type(None)


def check(condition: bool, key: str, message: str) -> None:
    """Raise a ConfigError naming `key` unless `condition` holds (for `validate` methods)."""
    if not condition:
        raise ConfigError(f"config key '{key}': {message}")


def check_seed(seed: int, key: str) -> None:
    """numpy takes seeds in [0, 2**32) only: another fails as the run starts, not at load."""
    check(0 <= seed < 2**32, key, f"{seed} is not a seed; give a whole number in [0, 2**32)")


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _describe(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(_describe(a) for a in get_args(tp))
    if tp is _NONE_TYPE:
        return "null"
    if origin in (list, tuple):
        return f"list of {_describe(get_args(tp)[0])}"
    if origin is dict:
        return f"mapping of {_describe(get_args(tp)[1])}"
    if dataclasses.is_dataclass(tp):
        return f"mapping with keys {', '.join(f.name for f in dataclasses.fields(tp))}"
    return getattr(tp, "__name__", str(tp))


def _convert(tp: Any, value: Any, key: str) -> Any:
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        allowed = get_args(tp)
        if value in allowed and type(value) in {type(a) for a in allowed}:
            return value
        raise ConfigError(
            f"config key '{key}': {value!r} is not allowed; allowed values: "
            + ", ".join(repr(a) for a in allowed)
        )
    if origin in (Union, types.UnionType):
        options = get_args(tp)
        if value is None:
            if _NONE_TYPE in options:
                return None
            raise ConfigError(f"config key '{key}': must not be null; expected {_describe(tp)}")
        errors = []
        # Try exact-type matches first so `int | str` keeps 3 an int and "3" a str.
        ordered = sorted(
            (o for o in options if o is not _NONE_TYPE),
            key=lambda o: 0 if isinstance(o, type) and type(value) is o else 1,
        )
        for option in ordered:
            try:
                return _convert(option, value, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(f"config key '{key}': {value!r} does not match any of: {_describe(tp)}")
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return from_dict(tp, value, key)
    if origin in (list, tuple):
        if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
            raise ConfigError(f"config key '{key}': expected a list, got {value!r}")
        item_type = get_args(tp)[0] if get_args(tp) else Any
        items = [_convert(item_type, v, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"config key '{key}': expected a mapping, got {value!r}")
        _, value_type = get_args(tp) or (str, Any)
        return {str(k): _convert(value_type, v, _join(key, str(k))) for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in YES_NO:
            return YES_NO[value.lower()]
        raise ConfigError(f"config key '{key}': expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"config key '{key}': expected an integer, got {value!r}")
    if tp is float:
        number = None
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            # a string: YAML 1.1 reads "3e-4" as one; OverflowError: an int of 400 digits
            with contextlib.suppress(ValueError, OverflowError):
                number = float(value)
        if number is not None and math.isfinite(number):
            return number
        # nan passes every range check (all comparisons are false) and inf most of them
        what = "a finite number" if number is not None else "a number"
        raise ConfigError(f"config key '{key}': expected {what}, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"config key '{key}': expected a string, got {value!r}")
    if tp is Path:
        if isinstance(value, (str, Path)):
            return Path(value)
        raise ConfigError(f"config key '{key}': expected a path, got {value!r}")
    raise TypeError(f"unsupported config field type {tp!r} at {key}")


def _over_default(f: dataclasses.Field[Any], value: Any) -> Any:
    """A partial mapping for a nested dataclass field applies over that field's own default.

    `FinetuneConfig.optimizer` defaults to `OptimizerConfig(lr=5e-5, warmup_steps=0)`; setting
    only `finetune.optimizer.lr` must keep warmup_steps=0, not fall back to the class's 100.
    """
    if value is not None and not isinstance(value, Mapping):
        return value
    if f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
    elif f.default is not dataclasses.MISSING:
        default = f.default
    else:
        return value
    if not (dataclasses.is_dataclass(default) and not isinstance(default, type)):
        return value
    return deep_merge(to_dict(default), value or {})  # an empty section (null): the default


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`over` applied onto a copy of `base`, section by section (neither is modified)."""
    out = copy.deepcopy(dict(base))
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def from_dict(cls: type[T], data: Any, prefix: str = "") -> T:
    """Build dataclass `cls` from a mapping, converting and validating every field."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        where = f"config key '{prefix}'" if prefix else "config"
        raise ConfigError(f"{where}: expected a mapping, got {data!r}")
    assert dataclasses.is_dataclass(cls)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields), key=str)  # keys may mix types (1, "a")
    moved: Mapping[str, str] = getattr(cls, "MOVED", {})
    for name in unknown:
        if name in moved:
            raise ConfigError(
                f"config key '{_join(prefix, str(name))}' has moved to '{moved[name]}'",
                f"write it as {moved[name]} (the setting belongs to the stage that uses it)",
            )
    if unknown:
        key = _join(prefix, str(unknown[0]))
        raise ConfigError(
            f"config key '{key}' is unknown; allowed keys here: {', '.join(sorted(fields))}"
        )
    missing = [
        name
        for name, f in fields.items()
        if name not in data
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:  # `cls(**kwargs)` would raise a TypeError naming no file or key
        keys = ", ".join(f"'{_join(prefix, name)}'" for name in missing)
        raise ConfigError(f"config key {keys} is required and missing")
    kwargs = {
        name: _convert(hints[name], _over_default(fields[name], data[name]), _join(prefix, name))
        for name in data
    }
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if callable(validate):
        validate(prefix)
    return obj


def to_dict(obj: Any) -> Any:
    """Plain nested dicts/lists/scalars (YAML- and JSON-safe) from a config dataclass."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): to_dict(v) for k, v in obj.items()}
    if isinstance(obj, Path):
        return str(obj)
    return obj


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` -> `{"a.b": 1}`; lists stay values (MLflow params, hashing)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        full = _join(prefix, str(key))
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, full))
        else:
            out[full] = value
    return out


def _field_type(cls: Any, parts: list[str]) -> Any:
    """The declared type at dotted key `parts` of dataclass `cls`; None where there is none."""
    tp = cls
    for part in parts:
        if dataclasses.is_dataclass(tp):
            tp = typing.get_type_hints(tp).get(part)
        elif get_origin(tp) is dict and get_args(tp):
            tp = get_args(tp)[1]
        else:
            return None
    return tp


def key_path(
    data: Mapping[str, Any], parts: list[str], whole: Callable[[list[str]], bool]
) -> list[str]:
    """The keys a `--set` key (`parts`: split at its dots) names in nested `data`. Some keys
    hold dots themselves (a grid's `finetune.head`, a tag `mlflow.note.content`): at each level
    the longest run of parts that is a key there is taken; where `whole(path so far)` says
    the mapping's keys are whole dotted keys (a grid, `tracking.tags`), the rest is one key."""
    path: list[str] = []
    node: Any = data
    i = 0
    while i < len(parts):
        if whole(path):
            return [*path, ".".join(parts[i:])]
        keys = node if isinstance(node, Mapping) else {}
        j = next((j for j in range(len(parts), i, -1) if ".".join(parts[i:j]) in keys), i + 1)
        path.append(".".join(parts[i:j]))
        node = keys.get(path[-1])
        i = j
    return path


def whole_keys(cls: Any) -> Callable[[list[str]], bool]:
    """Of config dataclass `cls`: a `dict[str, X]` of plain values (`tracking.tags`) is keyed
    by whole names, dots and all."""

    def whole(path: list[str]) -> bool:
        tp = _field_type(cls, path) if cls is not None and path else None
        if get_origin(tp) is not dict or len(get_args(tp)) != 2:
            return False
        value = get_args(tp)[1]
        return not dataclasses.is_dataclass(value) and get_origin(value) is not dict

    return whole


def apply_overrides(
    data: dict[str, Any],
    overrides: Iterable[str],
    cls: Any = None,
    whole: Callable[[list[str]], bool] | None = None,
) -> dict[str, Any]:
    """Set dotted keys in a nested dict (creating sections as needed); returns `data`.
    A key that holds dots is addressed in full (`key_path`); `whole` adds mappings keyed by
    dotted keys to those of `cls`.

    With the config dataclass `cls`, a key declared `str` gets the text as typed where YAML
    would read something else ("2024.10" not 2024.1, "0755" not 755, "run #3" not "run",
    "a: b" not a mapping); a quoted value keeps YAML's reading, null stays null.
    A mapping given for a section sets those keys in it (`model={num_layers: 2}` keeps the
    file's other model keys); `section=null` resets the section to its defaults.
    """
    by_cls = whole_keys(cls)

    def whole_here(path: list[str]) -> bool:
        return by_cls(path) or (whole is not None and whole(path))

    for text in overrides:
        try:
            parts, value = parse_override(text)
            parts = key_path(data, parts, whole_here)
        except ConfigError:  # not YAML ("@x", "'a"): still the text as typed, for a str key
            parts = key_path(data, text.split("=", 1)[0].strip().split("."), whole_here)
            if cls is None or "=" not in text or _field_type(cls, parts) not in (str, Path):
                raise
            value = text.split("=", 1)[1].strip()
        raw = text.split("=", 1)[1].strip()
        quoted = isinstance(value, str) and raw[:1] in ("'", '"')
        if (
            cls is not None
            and value is not None
            and not quoted
            and _field_type(cls, parts) in (str, Path)
        ):
            value = raw
        node = data
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                section = ".".join(parts[: i + 1])
                raise ConfigError(f"override {text!r}: '{section}' is a value, not a section")
            node = child
        if isinstance(value, Mapping) and isinstance(node.get(parts[-1]), Mapping):
            value = deep_merge(node[parts[-1]], value)  # the section's other keys stay
        node[parts[-1]] = value
    return data


def load(cls: type[T], path: Path | None = None, overrides: Iterable[str] = ()) -> T:
    """Defaults, then the YAML file, then `--set` overrides; validated once at the end."""
    data: dict[str, Any] = read_yaml(path) if path is not None else {}
    overrides = list(overrides)
    try:
        return from_dict(cls, apply_overrides(data, overrides, cls))
    except ConfigError as exc:
        if path is None or "config key" not in exc.message:
            raise
        named = re.search(r"config key '([^'\[]+)", exc.message)
        if named and _set_by(named.group(1), overrides):
            raise  # the key the error names was set by --set: the file is not to blame
        # a conflict between the file and a --set key the message mentions: name both
        also = [
            k
            for k in _set_keys(overrides)
            if re.search(rf"(?<![\w.]){re.escape(k)}\b", exc.message)
        ]
        where = f"{path} with --set {', '.join(also)}" if also else str(path)
        raise ConfigError(f"{where}: {exc.message}", exc.hint) from exc


def _set_keys(overrides: list[str]) -> list[str]:
    return [text.split("=", 1)[0].strip() for text in overrides]


def _set_by(key: str, overrides: list[str]) -> bool:
    """Whether `key` (or a section above or a key below it) was set by an override."""
    return any(
        key == k or key.startswith(k + ".") or k.startswith(key + ".") for k in _set_keys(overrides)
    )


def dump_yaml(obj: Any, path: Path) -> None:
    """Save a config (dataclass or dict) as YAML, atomically."""
    atomic_write_text(path, yaml.safe_dump(to_dict(obj), sort_keys=False, allow_unicode=True))
