"""Classification metrics (scikit-learn) and their aggregation over seeds.

Macro-F1 is the published TNCC figure; weighted-F1 is what DMA-ALBERT also reports, so both
are always computed, from the same predictions, over the full label list (a class absent from a
split still counts in macro averages as zero, as scikit-learn does with `labels=`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sklearn.metrics import (
    accuracy_score,
    classification_report,
    confusion_matrix,
    precision_recall_fscore_support,
)

from tibnlp.evaluation.spread import mean_std

# A fine-tuning whose validation macro-F1 is within this (absolute) of the majority-class
# predictor's has not learned: it predicts (nearly) one class.
NOT_LEARNING_MARGIN = 0.02

SUMMARY_KEYS = (
    "accuracy",
    "macro_precision",
    "macro_recall",
    "macro_f1",
    "weighted_precision",
    "weighted_recall",
    "weighted_f1",
)


@dataclass
class Metrics:
    """Scores of one prediction set; `summary` holds the scalar metrics (fractions, not %;
    the test part's `*_flip_excluded` beside its flip rates are counts of texts).

    The item-level `targets` and `predictions` are kept so that two systems scored on the same
    items can be compared by a paired bootstrap (`evaluation.significance`); records written
    before they were kept load with both empty."""

    summary: dict[str, float]
    per_class: dict[str, dict[str, float]] = field(default_factory=dict)
    confusion: list[list[int]] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    count: int = 0
    targets: list[int] = field(default_factory=list)
    predictions: list[int] = field(default_factory=list)

    def __getitem__(self, key: str) -> float:
        return self.summary[key]


def compute_metrics(y_true: Sequence[int], y_pred: Sequence[int], labels: Sequence[str]) -> Metrics:
    """Accuracy, macro and weighted P/R/F1, per-class report and confusion matrix."""
    ids = list(range(len(labels)))
    true = np.asarray(y_true, dtype=np.int64)
    pred = np.asarray(y_pred, dtype=np.int64)
    if len(true) == 0:
        return Metrics(summary={k: float("nan") for k in SUMMARY_KEYS}, labels=list(labels))
    summary = {"accuracy": float(accuracy_score(true, pred))}
    for average in ("macro", "weighted"):
        p, r, f, _ = precision_recall_fscore_support(
            true, pred, labels=ids, average=average, zero_division=0
        )
        summary[f"{average}_precision"] = float(p)
        summary[f"{average}_recall"] = float(r)
        summary[f"{average}_f1"] = float(f)
    report: dict[str, Any] = classification_report(
        true, pred, labels=ids, target_names=list(labels), zero_division=0, output_dict=True
    )
    per_class = {
        name: {k: float(v) for k, v in report[name].items()} for name in labels if name in report
    }
    cm = confusion_matrix(true, pred, labels=ids)
    return Metrics(
        summary=summary,
        per_class=per_class,
        confusion=cm.tolist(),
        labels=list(labels),
        count=len(true),
        targets=true.tolist(),
        predictions=pred.tolist(),
    )


def aggregate(runs: Sequence[dict[str, float]]) -> dict[str, tuple[float, float]]:
    """Mean and sample standard deviation (ddof=1; 0.0 for one run) of each key over runs.

    Keys missing from some runs are aggregated over the runs that have them.
    """
    keys: list[str] = []
    for run in runs:
        keys += [k for k in run if k not in keys]
    out = {}
    for key in keys:
        values = [float(r[key]) for r in runs if key in r and not math.isnan(float(r[key]))]
        out[key] = mean_std(values)
    return out


def majority_macro_f1(y_true: Sequence[int], n_labels: int) -> float:
    """Macro-F1 of always predicting the most frequent class of `y_true`: what a classifier
    collapsed onto one class scores (its F1 2p/(1+p) on that class, zero on the others)."""
    if not len(y_true) or n_labels < 1:
        return float("nan")
    share = float(np.bincount(np.asarray(y_true, dtype=np.int64), minlength=n_labels).max())
    share /= len(y_true)
    return 2 * share / (1 + share) / n_labels


def not_learning(macro_f1: float, majority: float, margin: float = NOT_LEARNING_MARGIN) -> bool:
    """True when a macro-F1 is no better (within `margin`) than the majority-class predictor."""
    return not math.isnan(majority) and not macro_f1 > majority + margin
