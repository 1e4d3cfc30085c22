"""Results as files (JSON, markdown) and as the rich table printed at the end of a run.

One row per fine-tuned system, mean ± std over seeds, in percent. Several result folders can
be put in one table (`tibnlp finetune report DIR...`) so that the baselines sit beside the
pretrained model on the same split and metrics.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from rich.table import Table

from tibnlp.errors import DataError
from tibnlp.fsutil import atomic_write_text

RESULTS_JSON = "results.json"

# (part, metric, column header)
COLUMNS = (
    ("validation", "macro_f1", "val macro-F1"),
    ("test", "macro_f1", "test macro-F1"),
    ("test", "weighted_f1", "test weighted-F1"),
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

# Published TNCC title results (macro-F1, test; each paper its own split): tncc/ANCHORS.md
TNCC_TITLE_ANCHORS = {
    "CBOW": 57.84,
    "TiBERT": 61.72,
    "DMA-ALBERT + CNN (seed paper)": 64.47,
    "DAN-FastText": 64.53,
}


class _ResultLike(Protocol):
    system: str
    dataset: str
    aggregate: dict[str, dict[str, tuple[float, float]]]
    notes: dict[str, Any]


def summary_dict(result: _ResultLike) -> dict[str, Any]:
    seeds = getattr(result, "seeds", [])
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
            }
            for s in seeds
        ],
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
    if seeds == 1:  # one seed has no spread: "± 0.00" would claim one
        return f"{100 * mean:.2f}"
    return f"{100 * mean:.2f} ± {100 * std:.2f}"


def _columns(rows: Sequence[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [c for c in COLUMNS if any(c[0] in r["aggregate"] for r in rows)]


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    cols = _columns(rows)
    head = ["dataset", "system", "seeds", *(c[2] for c in cols)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["dataset"], r["system"], str(len(r["seeds"]))]
        cells += [_cell(r["aggregate"], p, k, len(r["seeds"])) for p, k, _ in cols]
        lines.append("| " + " | ".join(cells) + " |")
    if any(r["dataset"] == "tncc-title" for r in rows):
        lines += ["", "Published TNCC title results (test macro-F1; own splits):"]
        lines += [f"- {name}: {value:.2f}" for name, value in TNCC_TITLE_ANCHORS.items()]
    return "\n".join(lines) + "\n"


def rich_table(rows: Sequence[dict[str, Any]]) -> Table:
    cols = _columns(rows)
    table = Table(title="fine-tuning results (%, mean ± std over seeds)")
    for name in ("dataset", "system", "seeds", *(c[2] for c in cols)):
        table.add_column(name, overflow="fold")
    for r in rows:
        cells = [_cell(r["aggregate"], p, k, len(r["seeds"])) for p, k, _ in cols]
        table.add_row(r["dataset"], r["system"], str(len(r["seeds"])), *cells)
    return table


def write_results(result: _ResultLike, directory: Path) -> list[Path]:
    """results.json (everything) and results.md (the table and notes) in `directory`."""
    data = summary_dict(result)
    directory = Path(directory)
    json_path, md_path = directory / RESULTS_JSON, directory / "results.md"
    atomic_write_text(json_path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    notes = "\n".join(f"- {k}: {v}" for k, v in result.notes.items())
    atomic_write_text(md_path, markdown_table([data]) + "\n" + notes + "\n")
    return [json_path, md_path]


def load_results(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """results.json files, or folders searched for them (e.g. the whole `runs/finetune`, or a
    pipeline's work directory, whose stage-level results.json files are skipped)."""
    rows = []
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
            except json.JSONDecodeError as exc:
                raise DataError(f"{f}: not valid JSON ({exc.msg})") from exc
            if not (isinstance(data, dict) and {"system", "aggregate", "seeds"} <= data.keys()):
                if searched:
                    continue
                raise DataError(f"{f}: not a fine-tuning result", "give a `tibnlp finetune` output")
            rows.append(data)
            found += 1
        if not found:
            raise DataError(f"no {RESULTS_JSON} under {path}", "give a `tibnlp finetune` output")
    return rows
