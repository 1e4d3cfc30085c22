"""`${stages.NAME.output}` references in a pipeline file: what they name, and their checks at
load. Once `${vars.NAME}` and `${name}` are substituted, a reference left in a stage's inputs,
config, params or variants must read the output of a stage above it; one that does not (a
misspelt field, `${stages.a.outptu}`) is refused when the file loads, naming the file and the
key, rather than when a plan (a `--dry-run` too) first resolves it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

from tibnlp.errors import ConfigError

REF = re.compile(r"\$\{([^}]+)\}")
_HEAD, _FIELD = "stages.", "output"
READABLE = "references are ${vars.NAME}, ${name} and ${stages.STAGE.output}"


def stage_ref(ref: str) -> str | None:
    """The stage that `stages.NAME.output` names (None for another reference): all between
    the two, as a stage name may hold dots (`eval.v2`: a plain folder name)."""
    ref = ref.strip()
    tail = f".{_FIELD}"
    if ref.startswith(_HEAD) and ref.endswith(tail) and len(ref) > len(_HEAD + tail):
        return ref[len(_HEAD) : -len(tail)]
    return None


def strings(obj: Any) -> Iterable[str]:
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from strings(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from strings(v)


def _located(obj: Any, key: str) -> Iterator[tuple[str, str]]:
    """(key path, reference) for each `${...}` in obj, the path as `--set` writes it."""
    if isinstance(obj, str):
        for ref in REF.findall(obj):
            yield key, ref.strip()
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _located(v, f"{key}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _located(v, f"{key}[{i}]")


def check_stage_refs(
    located: Iterable[tuple[str, str]], above: list[str], below: list[str], where: str
) -> None:
    """Each (key, reference) reads the output of a stage in `above`; `below`: the stages
    after this one (and itself), which it may not read (the file order is the run order)."""
    for key, ref in located:
        name = stage_ref(ref)
        if name is None:
            _refuse_other(ref, above + below, f"{where}: {key}")
        elif name not in above:
            stages = f"stages defined before it: {', '.join(above) or 'none'}"
            raise ConfigError(
                f"{where}: {key}: references stage '{name}', which is not defined above it"
                + (" (a stage may read only stages above it)" if name in below else ""),
                stages if name in below else f"no stage is named {name!r}; {stages}",
            )


def stage_located(stage: Any, at: str) -> Iterator[tuple[str, str]]:
    """The references of a `StageSpec`, keyed as its file writes them (`at`: stages.NAME)."""
    for part in ("inputs", "config", "params"):
        yield from _located(getattr(stage, part), f"{at}.{part}")
    for variant in stage.variants:
        for key, value in variant.overrides.items():
            yield from _located(value, f"{at}: variant {variant.name} sets {key}")


def _refuse_other(ref: str, stages: list[str], where: str) -> None:
    """A reference that names no stage's output: a misspelt field of a stage, or none."""
    if ref.startswith(_HEAD):
        for name in sorted(stages, key=len, reverse=True):  # `eval.v2` before `eval`
            if ref.startswith(f"{_HEAD}{name}."):
                field = ref[len(_HEAD + name) + 1 :]
                raise ConfigError(
                    f"{where}: ${{{ref}}}: stage {name!r} has no field {field!r}",
                    f"a stage's output is read as ${{stages.{name}.{_FIELD}}}",
                )
    raise ConfigError(f"{where}: unknown reference ${{{ref}}}", READABLE)


def no_stage_refs(config: Any, where: str) -> None:
    """The shared `config:` goes to every stage, the first ones included: a stage's output is
    no value there (it would reach the stages above that stage), nor is another reference."""
    for key, ref in _located(config if isinstance(config, dict) else {}, "config"):
        if ref.startswith(_HEAD):
            raise ConfigError(
                f"{where}: {key}: ${{{ref}}} reads a stage's output, "
                "which the shared config cannot",
                "set it in the `config:` of the stages that read it",
            )
        raise ConfigError(f"{where}: {key}: unknown reference ${{{ref}}}", READABLE)
