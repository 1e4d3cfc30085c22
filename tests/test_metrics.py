"""Metric computation against hand-computed values; aggregation over seeds; leakage; report."""

from __future__ import annotations

import math

import pytest

from tibnlp.errors import DataError
from tibnlp.evaluation.leakage import unseen_indices
from tibnlp.evaluation.metrics import aggregate, compute_metrics
from tibnlp.evaluation.plots import confusion_png
from tibnlp.evaluation.report import (
    STAGE_RUN,
    markdown_table,
    rich_table,
    select_best,
    summary_table,
)

LABELS = ["a", "b", "c"]


def test_metrics_match_hand_computation() -> None:
    # a: tp 1 fp 1 fn 1 -> P .5 R .5 F .5 ; b: tp 2 fp 1 fn 0 -> P 2/3 R 1 F .8 ; c: all 0
    m = compute_metrics([0, 0, 1, 1, 2], [0, 1, 1, 1, 0], LABELS)
    s = m.summary
    assert s["accuracy"] == pytest.approx(3 / 5)
    assert s["macro_precision"] == pytest.approx((0.5 + 2 / 3 + 0) / 3)
    assert s["macro_recall"] == pytest.approx((0.5 + 1 + 0) / 3)
    assert s["macro_f1"] == pytest.approx((0.5 + 0.8 + 0) / 3)
    # weighted by support 2, 2, 1
    assert s["weighted_precision"] == pytest.approx((0.5 * 2 + 2 / 3 * 2) / 5)
    assert s["weighted_recall"] == pytest.approx((0.5 * 2 + 1 * 2) / 5)
    assert s["weighted_f1"] == pytest.approx((0.5 * 2 + 0.8 * 2) / 5)
    assert m.confusion == [[1, 1, 0], [0, 2, 0], [1, 0, 0]]
    assert m.per_class["b"]["f1-score"] == pytest.approx(0.8)
    assert m.per_class["c"]["support"] == 1
    assert m.count == 5


def test_absent_class_counts_in_macro_average() -> None:
    s = compute_metrics([0, 1], [0, 1], LABELS).summary
    assert s["accuracy"] == 1.0
    assert s["macro_f1"] == pytest.approx(2 / 3)  # class c: no support, F1 0
    assert s["weighted_f1"] == 1.0


def test_empty_split_gives_nan_not_a_crash() -> None:
    assert math.isnan(compute_metrics([], [], LABELS)["macro_f1"])


def test_aggregate_mean_and_sample_std() -> None:
    agg = aggregate([{"f1": 0.5, "acc": 0.9}, {"f1": 0.7, "acc": 0.9}, {"f1": 0.6, "acc": 0.9}])
    assert agg["f1"][0] == pytest.approx(0.6)
    assert agg["f1"][1] == pytest.approx(0.1)  # ddof=1: sqrt(((.1)^2 + (.1)^2) / 2)
    assert agg["acc"] == pytest.approx((0.9, 0.0))
    assert aggregate([{"f1": 0.4}])["f1"] == (0.4, 0.0)


def test_unseen_indices_use_the_model_form() -> None:
    train = ["ཀ་ཁ", "ག"]
    test = ["ཀ ཁ", "ང", "ག"]
    assert unseen_indices(train, test) == [0, 1]
    assert unseen_indices(train, test, key=lambda t: t.replace(" ", "\u0f0b")) == [1]


def test_confusion_png_is_written(tmp_path) -> None:
    path = confusion_png([[1, 1, 0], [0, 2, 0], [1, 0, 0]], LABELS, tmp_path / "cm.png", "t")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tables_show_mean_and_std_in_percent() -> None:
    row = {
        "dataset": "tncc-title",
        "system": "x",
        "seeds": [{}, {}],
        "aggregate": {"test": {"macro_f1": {"mean": 0.6, "std": 0.1}}},
    }
    md = markdown_table([row])
    assert "| tncc-title | x | 2 | 60.00 ± 10.00 | - | - |" in md  # weighted-F1, acc absent
    assert "DMA-ALBERT" in md  # published anchors under TNCC title tables
    assert rich_table([row]).row_count == 1


def test_one_seed_shows_no_spread() -> None:
    row = {
        "dataset": "tncc-title",
        "system": "x",
        "seeds": [{}],
        "aggregate": {"test": {"macro_f1": {"mean": 0.6, "std": 0.0}}},
    }
    assert "| tncc-title | x | 1 | 60.00 | - | - |" in markdown_table([row])


def _cells(line: str) -> list[str]:
    """A markdown table line's cells as GitHub reads it: split at the pipes a backslash does
    not escape, each cell unescaped."""
    cells, cell, chars = [], "", iter(line.strip().removeprefix("|").removesuffix("|"))
    for c in chars:
        if c == "\\":
            cell += next(chars)
        elif c == "|":
            cells, cell = [*cells, cell.strip()], ""
        else:
            cell += c
    return [*cells, cell.strip()]


def test_markdown_tables_escape_pipes_and_line_breaks_in_cells() -> None:
    """A `|` or a line break in a system's name, a pipeline run or a recipe value stays in its
    cell: the row keeps its columns (results.md, a pipeline's summary table)."""
    system = "albert-pretrained(a|b)+cnn"
    row = {
        "dataset": "tncc-title",
        "system": system,
        "seeds": [{}],
        "aggregate": {
            "validation": {"macro_f1": {"mean": 0.5, "std": 0.0}},
            "test": {"macro_f1": {"mean": 0.6, "std": 0.0}},
        },
        "notes": {"recipe": {"tag": "x|y\\|z\nnext"}},
        STAGE_RUN: "finetune[v=1|2]",
    }
    md = markdown_table(select_best([row])).splitlines()
    head, cells = _cells(md[0]), _cells(md[2])
    assert len(cells) == len(head)
    assert cells[1] == system and cells[head.index("test macro-F1")] == "60.00"
    assert cells[-1] == "tag=x|y\\|z next (best of 1)"
    pipeline = summary_table([row, {**row, STAGE_RUN: "finetune[v=3]"}]).splitlines()
    head, cells = _cells(pipeline[2]), _cells(pipeline[4])
    assert len(cells) == len(head)
    assert cells[head.index("system")] == system
    assert cells[head.index("pipeline run")] == "finetune[v=1|2]"
    assert cells[head.index("test macro-F1")] == "60.00"


def test_select_best_keeps_the_best_validation_run_per_system() -> None:
    def row(system: str, val: float, test: float, lr: float) -> dict:
        return {
            "dataset": "tncc-title",
            "system": system,
            "seeds": [{}],
            "aggregate": {
                "validation": {"macro_f1": {"mean": val, "std": 0.0}},
                "test": {"macro_f1": {"mean": test, "std": 0.0}},
            },
            "notes": {"recipe": {"lr": lr}},
        }

    rows = [row("a", 0.5, 0.9, 1e-3), row("a", 0.6, 0.4, 3e-3), row("b", 0.2, 0.2, 1e-4)]
    chosen = select_best(rows)
    # selection never looks at test: the higher test score of a's first run does not count
    assert [(r["system"], r["notes"]["recipe"]["lr"]) for r in chosen] == [("a", 3e-3), ("b", 1e-4)]
    assert [r["selected_from"] for r in chosen] == [2, 1]
    md = markdown_table(chosen)
    assert "lr=0.003 (best of 2)" in md and md.splitlines()[0].endswith("| recipe |")
    # fine-tuned on 371 labels instead of all: a point of its own, not a rival recipe
    few = {**row("a", 0.9, 0.9, 1e-3), "notes": {"recipe": {"lr": 1e-3}, "sizes": {"train": 371}}}
    chosen = select_best([*rows, few])
    assert [(r["system"], r["selected_from"]) for r in chosen] == [("a", 2), ("b", 1), ("a", 1)]
    assert chosen[0]["notes"]["recipe"]["lr"] == 3e-3
    no_val = {**row("c", 0.0, 0.5, 1e-3), "aggregate": {"test": {"macro_f1": {"mean": 0.5}}}}
    with pytest.raises(DataError, match="c: no run has a validation macro_f1"):
        select_best([no_val])


def test_mean_std_is_the_one_spread_every_table_reports() -> None:
    """Sample std (ddof=1), 0 for one run, NaN for none: `aggregate`, the curve and
    `runs compare` all read it."""
    from tibnlp.evaluation.spread import mean_std

    mean, std = mean_std([60.0, 62.0, 64.0])
    assert (mean, std) == (62.0, 2.0)
    assert mean_std([61.5]) == (61.5, 0.0)
    assert all(math.isnan(x) for x in mean_std([]))
