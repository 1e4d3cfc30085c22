"""A stage's variants: its `grid` (the product of the listed values) and its explicit
`variants` list, expanded into named overrides; each variant is a node of its own, so two
that print alike (one name, two runs) are refused."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tibnlp.errors import ConfigError

PARAMS = "params."  # a grid or variant key that sets a stage param, not a config key


@dataclass
class Variant:
    name: str
    overrides: dict[str, Any]  # dotted config key -> value


def _variant_label(key: str, value: Any) -> str:
    short = key.split(".")[-1]
    if isinstance(value, list):
        value = "-".join(map(str, value)) or "none"
    return f"{short}={value}"


def _distinct_labels(key: str, values: list[Any], where: str) -> None:
    """Two values that print alike would make two nodes of one name (two MLflow runs of one
    name, one result overwriting the other; the same number twice runs twice): refused."""
    seen: dict[str, Any] = {}
    for value in values:
        label = _variant_label(key, value)
        if label not in seen:
            seen[label] = value
        elif seen[label] == value and type(seen[label]) is type(value):
            raise ConfigError(
                f"{where}: lists {value!r} twice (as YAML reads it: 1e-4 and 0.0001 are one "
                "number)",
                "list each value once",
            )
        else:
            raise ConfigError(
                f"{where}: values {seen[label]!r} and {value!r} both name the variant '{label}'",
                "list values that print differently (one type: all numbers or all strings), "
                "or name each run with `variants: [{name: ..., set: {...}}]`",
            )


def _check_key(key: Any, where: str) -> None:
    """A grid or variant key is a dotted key (`1:` or `null:` would fail as a traceback)."""
    if not isinstance(key, str) or not all(part.strip() for part in key.split(".")):
        raise ConfigError(
            f"{where}: {key!r} is not a dotted key",
            "write section.key (e.g. model.heads.small) or params.NAME",
        )


def expand_variants(stage: str, grid: Any, variants: Any, where: str) -> list[Variant]:
    """Explicit `variants` x the product of `grid` values; one unnamed variant when neither."""
    base = [Variant("", {})]
    if variants is not None:
        if not isinstance(variants, list) or not variants:
            raise ConfigError(f"{where}.variants: expected a non-empty list of {{name, set}}")
        base = []
        for i, v in enumerate(variants):
            if not isinstance(v, dict) or set(v) - {"name", "set"} or "set" not in v:
                raise ConfigError(f"{where}.variants[{i}]: expected {{name: ..., set: {{...}}}}")
            if not isinstance(v["set"], dict):
                raise ConfigError(f"{where}.variants[{i}].set: expected a mapping of dotted keys")
            if isinstance(v.get("name"), (dict, list)):
                raise ConfigError(f"{where}.variants[{i}].name: expected a single value")
            for key in v["set"]:
                _check_key(key, f"{where}.variants[{i}].set")
            name = str(v.get("name") or ",".join(_variant_label(k, x) for k, x in v["set"].items()))
            base.append(Variant(name, dict(v["set"])))
        names = [v.name for v in base]
        if len(set(names)) != len(names):
            raise ConfigError(f"{where}.variants: names must be unique, got {names}")
    if grid is None:
        return base
    if not isinstance(grid, dict) or not grid:
        raise ConfigError(f"{where}.grid: expected a mapping of dotted key -> list of values")
    out = base
    for key, values in grid.items():
        _check_key(key, f"{where}.grid")
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}.grid.{key}: expected a non-empty list of values")
        _distinct_labels(key, values, f"{where}.grid.{key}")
        out = [
            Variant(
                ",".join(p for p in (v.name, _variant_label(key, x)) if p),
                {**v.overrides, key: x},
            )
            for v in out
            for x in values
        ]
    return out
