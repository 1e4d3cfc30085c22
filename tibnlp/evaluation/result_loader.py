"""Fine-tuning results read back from results.json files, checked before any table reads them.

A results.json may be edited by hand, cut short or written by an older version: every key the
tables and `finetune compare` read is checked here, so a bad file is named with its bad key
rather than met as a KeyError deep in a table. Rendering the rows is `report`'s job.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tibnlp.errors import DataError
from tibnlp.standard_json import nan_for_null, nan_for_nulls
from tibnlp.text.input_files import source_names

RESULTS_JSON = "results.json"
# a row's result folder, shortened (`load_results(..., sourced=True)`): for the table only, a
# row given to `pool_rows` has none (a copy of a run must still compare equal to it)
SOURCE = "source"


def load_results(paths: Sequence[Path], sourced: bool = False) -> list[dict[str, Any]]:
    """results.json files, or folders searched for them (e.g. the whole `runs/finetune`, or a
    pipeline's work directory, whose stage-level results.json files are skipped). `sourced`:
    each row gets SOURCE, the end of its folder's path that tells it from the others'."""
    found = _load_files(paths)
    if not sourced:
        return [row for _, row in found]
    # a folder's name, with as many folders above it as tell it from the others
    names = source_names([f.parent if f.name == RESULTS_JSON else f for f, _ in found])
    return [{**row, SOURCE: name} for (_, row), name in zip(found, names, strict=True)]


def _load_files(paths: Sequence[Path]) -> list[tuple[Path, dict[str, Any]]]:
    rows = []
    seen: set[Path] = set()  # a file named twice (itself and its folder) is one row, not two
    for path in paths:
        path = Path(path)
        searched = path.is_dir()
        files = sorted(path.rglob(RESULTS_JSON)) if searched else [path]
        found = 0
        for f in files:
            if not f.is_file():
                continue
            try:
                data = json.loads(f.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                why = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
                raise DataError(f"{f}: not valid JSON ({why})") from exc
            if not (isinstance(data, dict) and {"system", "aggregate", "seeds"} <= data.keys()):
                if searched:
                    continue
                raise DataError(f"{f}: not a fine-tuning result", "give a `tibnlp finetune` output")
            found += 1
            if f.resolve() not in seen:
                seen.add(f.resolve())
                rows.append((f, _checked(data, f)))
        if not found:
            raise DataError(f"no {RESULTS_JSON} under {path}", "give a `tibnlp finetune` output")
    return rows


def _checked(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """`data` when the tables can read it: a result edited by hand or cut short is named with
    its bad key here, not met as a KeyError or TypeError deep in a table."""
    hint = "write it again with `tibnlp finetune`, or leave it out"
    for key in ("system", "dataset"):
        if not isinstance(data.get(key), str):
            raise DataError(f"{path}: key {key!r} is missing or not a string", hint)
    if not isinstance(data["seeds"], list):
        raise DataError(f"{path}: key 'seeds' is not a list", hint)
    aggregate = data["aggregate"]
    if not isinstance(aggregate, dict):
        raise DataError(f"{path}: key 'aggregate' is not an object", hint)
    for part, metrics in aggregate.items():
        if not isinstance(metrics, dict):
            raise DataError(f"{path}: aggregate.{part} is not an object", hint)
        for name, value in metrics.items():
            value = metrics[name] = _mean_std_read(value)
            pair = [value.get("mean"), value.get("std")] if isinstance(value, dict) else value
            if not (
                isinstance(pair, list)
                and len(pair) == 2
                and all(isinstance(x, int | float) and not isinstance(x, bool) for x in pair)
            ):
                raise DataError(
                    f"{path}: aggregate.{part}.{name} is not a mean and std ({value!r})", hint
                )
    _check_items(data, path, hint)
    return data


def _mean_std_read(value: Any) -> Any:
    """An aggregate's mean and std with a null (a score not known, NaN when written) as NaN."""
    if isinstance(value, dict) and {"mean", "std"} <= value.keys():
        return {**value, "mean": nan_for_null(value["mean"]), "std": nan_for_null(value["std"])}
    return [nan_for_null(x) for x in value] if isinstance(value, list) else value


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _ids(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in x)


def _check_items(data: dict[str, Any], path: Path, hint: str) -> None:
    """The parts of a results.json the tables and `finetune compare` read besides the
    aggregate: the notes they show, each seed's scores and the item-level predictions, which
    must be one label id of `labels` per item of `targets` (a paired bootstrap reads them)."""
    notes = data.get("notes", {})
    if not isinstance(notes, dict):
        raise DataError(f"{path}: key 'notes' is not an object", hint)
    majority = notes.get("validation_majority_macro_f1")
    if majority is not None and not _number(majority):
        raise DataError(f"{path}: notes.validation_majority_macro_f1 is not a number", hint)
    for key, field in (("sizes", "train"), ("pretraining", "tokens")):
        value = notes.get(key, {})
        if isinstance(value, dict) and field in value and not _number(value[field]):
            raise DataError(f"{path}: notes.{key}.{field} is not a number ({value[field]!r})", hint)
    if "recipe" in notes and not isinstance(notes["recipe"], dict | None):
        raise DataError(f"{path}: notes.recipe is not an object", hint)
    labels = data.get("labels", [])
    if not (isinstance(labels, list) and all(isinstance(x, str) for x in labels)):
        raise DataError(f"{path}: key 'labels' is not a list of label names", hint)
    targets = data.get("targets", {})
    if not isinstance(targets, dict):
        raise DataError(f"{path}: key 'targets' is not an object of parts", hint)

    def ids(where: str, value: Any, length: int | None) -> None:
        if not _ids(value):
            raise DataError(f"{path}: {where} is not a list of label ids", hint)
        if labels and any(not 0 <= i < len(labels) for i in value):
            raise DataError(
                f"{path}: {where} holds a label id outside 0..{len(labels) - 1} "
                f"(its {len(labels)} labels)",
                hint,
            )
        if length is not None and len(value) != length:
            raise DataError(
                f"{path}: {where} has {len(value)} items, targets.{where.rpartition('.')[2]} "
                f"{length}",
                hint,
            )

    for part, value in targets.items():
        ids(f"targets.{part}", value, None)
    for i, seed in enumerate(data["seeds"]):
        name = f"seeds[{i}]"
        if not isinstance(seed, dict):
            raise DataError(f"{path}: {name} is not an object", hint)
        for key in ("metrics", "predictions"):
            if not isinstance(seed.get(key, {}), dict):
                raise DataError(f"{path}: {name}.{key} is not an object of parts", hint)
        for part, metrics in seed.get("metrics", {}).items():
            metrics = seed["metrics"][part] = nan_for_nulls(metrics)
            if not (isinstance(metrics, dict) and all(map(_number, metrics.values()))):
                raise DataError(f"{path}: {name}.metrics.{part} is not an object of numbers", hint)
        for part, value in seed.get("predictions", {}).items():
            kept = targets.get(part)
            ids(f"{name}.predictions.{part}", value, len(kept) if isinstance(kept, list) else None)


def load_one_result(path: Path) -> dict[str, Any]:
    """The one system's results a results.json (or a folder holding one) gives; a folder of
    several systems is refused, naming them."""
    rows = load_results([path])
    if len(rows) != 1:
        systems = ", ".join(f"{r['dataset']} {r['system']}" for r in rows)
        raise DataError(
            f"{path} holds {len(rows)} results ({systems})", "give one system's results.json"
        )
    return rows[0]
