"""Results as files (JSON, markdown) and as the rich table printed at the end of a run.

Reading results.json files back, checked, is `result_loader`'s job.

One row per fine-tuned system, mean ± std over seeds, in percent. Several result folders can
be put in one table (`tibnlp finetune report DIR...`) so that the baselines sit beside the
pretrained model on the same split and metrics.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from rich.markup import escape
from rich.table import Table

from tibnlp.errors import DataError
from tibnlp.evaluation.anchors import TNCC_TITLE_MACRO_F1
from tibnlp.evaluation.counts import count_text, is_count
from tibnlp.evaluation.markdown import markdown_rows
from tibnlp.evaluation.metrics import not_learning
from tibnlp.evaluation.result_loader import RESULTS_JSON, SOURCE
from tibnlp.evaluation.significance import compare_rows, row_predictions
from tibnlp.fsutil import atomic_write_text
from tibnlp.standard_json import dumps

RESULTS_MD = "results.md"
STAGE_RUN = "stage_run"  # a row's pipeline stage run (`finetune[lr=0.002]`), set by the runner
_NUMBER_LIST = re.compile(r"\[[-+0-9.eEnul,\s]*\]")  # a JSON list of numbers (or null) only


def result_json(data: Any, indent: int = 2) -> str:
    """Standard JSON (a NaN score as null: `standard_json`) with every list of numbers on one
    line: the per-item predictions and confusion rows stay readable beside the scores instead
    of one number a line. results.json and seed_result.json are written by it alone."""
    text = dumps(data, indent=indent, ensure_ascii=False)
    return _NUMBER_LIST.sub(
        lambda m: re.sub(r"\s+", " ", m.group(0)).replace("[ ", "[").replace(" ]", "]"), text
    )


# (part, metric, column header)
COLUMNS = (
    ("validation", "macro_f1", "val macro-F1"),
    ("test", "macro_f1", "test macro-F1"),
    ("test", "weighted_f1", "test weighted-F1"),
    # % of test predictions changed by appending a shad / tsheg (evaluation.robustness)
    ("test", "shad_flip_rate", "shad flips"),
    ("test", "tsheg_flip_rate", "tsheg flips"),
    # texts whose suffix is past the read length, left out of the rates: a count, shown
    # where some row left one out (`_columns`)
    ("test", "shad_flip_excluded", "shad flips: texts left out"),
    ("test", "tsheg_flip_excluded", "tsheg flips: texts left out"),
    ("test", "accuracy", "test acc"),
    ("test", "macro_precision", "test macro-P"),
    ("test", "macro_recall", "test macro-R"),
    ("test", "weighted_precision", "test weighted-P"),
    ("test", "weighted_recall", "test weighted-R"),
    ("test_unseen", "macro_f1", "unseen macro-F1"),
    ("test_unseen", "weighted_f1", "unseen weighted-F1"),
    ("advts_original", "accuracy", "AdvTS orig acc"),
    ("advts", "accuracy", "AdvTS adv acc"),
    ("advts", "macro_f1", "AdvTS adv macro-F1"),
)


class _ResultLike(Protocol):
    system: str
    dataset: str
    aggregate: dict[str, dict[str, tuple[float, float]]]
    notes: dict[str, Any]


def summary_dict(result: _ResultLike) -> dict[str, Any]:
    seeds = getattr(result, "seeds", [])
    first = seeds[0].metrics if seeds else {}
    return {
        "system": result.system,
        "dataset": result.dataset,
        "seeds": [
            {
                "seed": s.seed,
                "best_epoch": s.best_epoch,
                "epochs_run": s.epochs_run,
                "run_id": s.run_id,
                "metrics": {p: m.summary for p, m in s.metrics.items()},
                "per_class": {p: m.per_class for p, m in s.metrics.items()},
                "counts": {p: m.count for p, m in s.metrics.items()},
                "predictions": {p: m.predictions for p, m in s.metrics.items() if m.predictions},
            }
            for s in seeds
        ],
        # the items every seed was scored on, once (the paired bootstrap checks them)
        "targets": {p: m.targets for p, m in first.items() if m.targets},
        "labels": next((m.labels for m in first.values() if m.labels), []),
        "aggregate": {
            p: {k: {"mean": m, "std": sd} for k, (m, sd) in v.items()}
            for p, v in result.aggregate.items()
        },
        "notes": result.notes,
    }


def _cell(agg: dict[str, dict[str, Any]], part: str, key: str, seeds: int = 2) -> str:
    value = agg.get(part, {}).get(key)
    if value is None:
        return "-"
    mean, std = (value["mean"], value["std"]) if isinstance(value, dict) else value
    if math.isnan(mean):
        return "-"
    if is_count(key):  # not a fraction: not in %
        return count_text(mean, std)
    if seeds == 1:  # one seed has no spread: "± 0.00" would claim one
        return f"{100 * mean:.2f}"
    return f"{100 * mean:.2f} ± {100 * std:.2f}"


def not_learning_seeds(row: dict[str, Any]) -> int:
    """Seeds of a result whose validation macro-F1 stayed at the majority-class level."""
    majority = row.get("notes", {}).get("validation_majority_macro_f1")
    if majority is None:  # a result written before the check existed
        return 0
    return sum(
        not_learning(s["metrics"]["validation"]["macro_f1"], majority)
        for s in row["seeds"]
        if "validation" in s.get("metrics", {})
    )


def system_cell(row: dict[str, Any]) -> str:
    """The system's name, marked when some seeds did not learn (their scores are not results)."""
    stuck = not_learning_seeds(row)
    if not stuck:
        return str(row["system"])
    return f"{row['system']} (NOT LEARNING: {stuck}/{len(row['seeds'])} seeds at majority class)"


def _columns(rows: Sequence[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """The columns some row has a score for; a count only where some row's is not 0."""
    return [
        (part, key, head)
        for part, key, head in COLUMNS
        if any(part in r["aggregate"] for r in rows)
        and (not is_count(key) or any(_mean(r, part, key) > 0 for r in rows))
    ]


def _recipe(row: dict[str, Any]) -> str:
    """The selected recipe of a `select_best` row ("" for other rows)."""
    if "selected_from" not in row:
        return ""
    recipe = row.get("notes", {}).get("recipe") or {}
    text = ", ".join(f"{k}={v}" for k, v in recipe.items())
    return f"{text} (best of {row['selected_from']})"


def select_best(
    rows: Sequence[dict[str, Any]], part: str = "validation", metric: str = "macro_f1"
) -> list[dict[str, Any]]:
    """Per dataset, number of labelled training examples and system, the run (recipe) with
    the highest mean `part` `metric` (runs on fewer labels are another system, not a recipe).

    A recipe search selects on validation only; the test columns of the chosen rows are then
    the honest result. Each chosen row gets `selected_from` (how many it was chosen among).
    """
    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["dataset"], _train_size(row), row["system"]), []).append(row)
    chosen = []
    for (dataset, _, system), candidates in groups.items():
        scored = [r for r in candidates if not math.isnan(_mean(r, part, metric))]
        if not scored:
            raise DataError(f"{dataset} {system}: no run has a {part} {metric} to select on")
        best = max(scored, key=lambda r: _mean(r, part, metric))
        chosen.append({**best, "selected_from": len(candidates)})
    return chosen


def _mean(row: dict[str, Any], part: str, metric: str) -> float:
    value = row["aggregate"].get(part, {}).get(metric)
    if value is None:
        return float("nan")
    return float(value["mean"] if isinstance(value, dict) else value[0])


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    cols = _columns(rows)
    recipes = any("selected_from" in r for r in rows)
    head = ["dataset", "system", "seeds", *(c[2] for c in cols), *(["recipe"] if recipes else [])]
    body = [
        [r["dataset"], system_cell(r), str(len(r["seeds"]))]
        + [_cell(r["aggregate"], p, k, len(r["seeds"])) for p, k, _ in cols]
        + ([_recipe(r)] if recipes else [])
        for r in rows
    ]
    return "\n".join(markdown_rows(head, body) + _anchor_lines(rows)) + "\n"


def _anchor_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    if not any(r["dataset"] == "tncc-title" for r in rows):
        return []
    lines = ["", "Published TNCC title results (test macro-F1; each paper its own split):"]
    return lines + [f"- {a.name}: {a.value:.2f} ({a.source})" for a in TNCC_TITLE_MACRO_F1]


def _kind(system: str) -> str:
    if system.startswith("textcnn"):  # on a pretrained embedding it is a pretrained system
        return "pretrained" if system.endswith("(pretrained)") else "textcnn"
    return "random" if system.startswith("albert-random") else "pretrained"


def _tokens(row: dict[str, Any]) -> float:
    tokens = row.get("notes", {}).get("pretraining", {})
    return float(tokens.get("tokens", 0)) if isinstance(tokens, dict) else 0.0


def _train_size(row: dict[str, Any]) -> int:
    """Labelled training examples the row was fine-tuned on (0 when not recorded)."""
    sizes = row.get("notes", {}).get("sizes", {})
    return int(sizes.get("train", 0)) if isinstance(sizes, dict) else 0


def summary_table(rows: Sequence[dict[str, Any]]) -> str:
    """The table a pipeline ends with: test macro and weighted F1 (mean ± std over seeds) of
    every system, pretrained ones by their pretraining tokens, beside the random-init twin
    (with each pretrained row's gain over it, same head), TextCNN and the published results.
    Systems with seeds stuck at the majority class are marked, not read as results.

    Rows fine-tuned on different numbers of labelled examples (`finetune.limit_train`, a
    few-label curve) get a column for it and are compared with the twin of their own size.
    Where several twins share a size and head (recipes), the gain is over the one best on
    validation macro-F1: selection on validation only."""
    order = {"pretrained": 0, "random": 1, "textcnn": 2}
    by_size = len({_train_size(r) for r in rows}) > 1
    # a pipeline's grid gives rows of one system: the stage run that made each tells them apart
    alike = Counter((r["dataset"], _train_size(r), r["system"]) for r in rows)
    by_run = any(n > 1 for n in alike.values()) and any(STAGE_RUN in r for r in rows)
    rows = sorted(
        rows,
        key=lambda r: (r["dataset"], _train_size(r), order[_kind(r["system"])], _tokens(r)),
    )

    def key(r: dict[str, Any]) -> tuple[str, int, str]:
        return r["dataset"], _train_size(r), r["system"].partition("+")[2]

    twins: dict[tuple[str, int, str], dict[str, Any]] = {}
    recipes: dict[tuple[str, int, str], int] = {}  # twins per key
    for r in rows:
        if _kind(r["system"]) != "random":
            continue
        recipes[key(r)] = recipes.get(key(r), 0) + 1
        best = twins.get(key(r))
        if best is None or _mean(r, "validation", "macro_f1") > _mean(
            best, "validation", "macro_f1"
        ):
            twins[key(r)] = r
    head = ["dataset", *(["labelled examples"] if by_size else []), "system",
            *(["pipeline run"] if by_run else []), "pretraining tokens", "seeds",
            "test macro-F1", "test weighted-F1", "val macro-F1",
            "Δ test macro-F1 vs random init [95% interval over test items]"]  # fmt: skip
    body = []
    for r in rows:
        kind, n = _kind(r["system"]), len(r["seeds"])
        tokens = {"pretrained": f"{_tokens(r):,.0f}", "random": "0", "textcnn": "none"}[kind]
        twin = twins.get(key(r))
        gain = _gain(r, twin) if kind == "pretrained" and twin is not None else "-"
        cells = [r["dataset"], *([f"{_train_size(r):,}"] if by_size else [])]
        chosen = kind == "random" and recipes[key(r)] > 1 and twin is r
        mark = " (best on validation: the gains' baseline)" if chosen else ""
        cells += [system_cell(r) + mark, *([str(r.get(STAGE_RUN, ""))] if by_run else [])]
        cells += [tokens, str(n)]
        cells += [_cell(r["aggregate"], "test", "macro_f1", n)]
        cells += [_cell(r["aggregate"], "test", "weighted_f1", n)]
        cells += [_cell(r["aggregate"], "validation", "macro_f1", n), gain]
        body.append(cells)
    title = "Fine-tuning results (%, mean ± std over seeds; selection on validation only)"
    return "\n".join([title, "", *markdown_rows(head, body), *_anchor_lines(rows)]) + "\n"


def _gain(row: dict[str, Any], twin: dict[str, Any]) -> str:
    """The test macro-F1 gain over the twin, with its paired-bootstrap interval when both rows
    kept their predictions (`evaluation.significance`)."""
    diff = _mean(row, "test", "macro_f1") - _mean(twin, "test", "macro_f1")
    try:
        for kept in (row, twin):
            row_predictions(kept, "test")
    except DataError:  # results written before predictions were kept: the point gain only
        return f"{100 * diff:+.2f}"
    try:
        return f"{100 * diff:+.2f} {compare_rows(row, twin).interval()}"
    except DataError:  # both kept predictions, of other items: not silently a point gain
        return f"{100 * diff:+.2f} (not the same test items: no interval)"


def rich_table(rows: Sequence[dict[str, Any]]) -> Table:
    cols = _columns(rows)
    recipes = any("selected_from" in r for r in rows)
    # runs of one system (other settings, or encoders of one folder name) look alike: where
    # some do, each row's result folder tells them apart; the common table stays as it was
    alike = Counter((r["dataset"], r["system"]) for r in rows)
    by_source = any(n > 1 for n in alike.values()) and any(SOURCE in r for r in rows)
    table = Table(title="fine-tuning results (%, mean ± std over seeds)")
    head = ("dataset", "system", *(["result folder"] if by_source else []), "seeds")
    for name in (*head, *(c[2] for c in cols)):
        table.add_column(name, overflow="fold")
    if recipes:
        table.add_column("recipe (selected on validation macro-F1)", overflow="fold")
    for r in rows:
        # names are text, not markup: a grid variant's "enc[head=cnn]" lost its brackets
        cells = [escape(r["dataset"]), escape(system_cell(r))]
        cells += [escape(r.get(SOURCE, ""))] if by_source else []
        cells += [str(len(r["seeds"]))]
        cells += [_cell(r["aggregate"], p, k, len(r["seeds"])) for p, k, _ in cols]
        cells += [escape(_recipe(r))] if recipes else []
        table.add_row(*cells)
    return table


def write_results(result: _ResultLike, directory: Path) -> list[Path]:
    """results.json (everything) and results.md (the table and notes) in `directory`."""
    data = summary_dict(result)
    directory = Path(directory)
    json_path, md_path = directory / RESULTS_JSON, directory / RESULTS_MD
    atomic_write_text(json_path, result_json(data) + "\n")
    notes = "\n".join(f"- {k}: {v}" for k, v in result.notes.items())
    atomic_write_text(md_path, markdown_table([data]) + "\n" + notes + "\n")
    return [json_path, md_path]
