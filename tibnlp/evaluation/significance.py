"""Paired bootstrap over test items: how sure is "system A scores above system B"?

The spread over fine-tuning seeds says how far a score moves with the seed; it says nothing of
how far it would move on another sample of test items of the same size. On TNCC's 927 test
titles, with 18 to 225 per class, that second noise is the larger one for macro-F1. Both
systems are scored on the same resamples of the items (paired), each resample's score is the
mean over a system's seeds, and the percentiles of the differences give the interval (Efron
and Tibshirani 1993; Koehn 2004 and Dror et al. 2018 for its use in NLP). The seeds themselves
are not resampled: three of them make a poor bootstrap sample.

Seeds are not paired by number: A - B is the difference of the two seed-means, which is the
mean over every (A seed, B seed) pair, and equals the mean of seed-k-against-seed-k
differences whenever both have the same seeds. Pooled runs (`--pool`; `--pool-b` for B) add
their seeds to that system's mean, each seed weighing the same. The resampling is seeded
(`seed`, 0 by default), so an interval printed once reads the same on every rerun.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tibnlp.errors import DataError

METRICS = ("macro_f1", "weighted_f1", "accuracy")
CHUNK = 256  # resamples scored at once: bounds memory at CHUNK x items x 8 bytes


@dataclass(frozen=True)
class Difference:
    """A's and B's scores (mean over seeds, full item set), A - B, and its interval."""

    a: float
    b: float
    diff: float
    low: float
    high: float
    not_above: float  # share of resamples where A - B <= 0: a one-sided p-value
    level: float
    resamples: int
    items: int

    def interval(self, scale: float = 100.0) -> str:
        return f"[{scale * self.low:+.2f}, {scale * self.high:+.2f}]"


def _check_metric(metric: str) -> None:
    if metric not in METRICS:
        raise DataError(f"unknown metric {metric!r}", f"use one of {', '.join(METRICS)}")


def resampled_scores(
    true: np.ndarray, pred: np.ndarray, index: np.ndarray, n_labels: int, metric: str
) -> np.ndarray:
    """`metric` of `pred` against `true` on each row of `index` (resamples x items), as
    scikit-learn computes it over the full label list (a class absent from both sides of a
    resample scores F1 0 and still counts in the macro mean)."""
    _check_metric(metric)
    t, p = true[index], pred[index]
    rows, n = index.shape
    if metric == "accuracy":
        return np.asarray((t == p).mean(axis=1), dtype=np.float64)
    offset = np.arange(rows)[:, None] * n_labels
    cells = rows * n_labels  # one count per (resample, class); the last key is a discard bin

    def counts(keys: np.ndarray) -> np.ndarray:
        return np.bincount(keys.ravel(), minlength=cells + 1)[:cells].reshape(rows, n_labels)

    hits = counts(np.where(t == p, t + offset, cells))
    support, predicted = counts(t + offset), counts(p + offset)
    denom = support + predicted
    f1 = np.divide(2 * hits, denom, out=np.zeros(denom.shape), where=denom > 0)
    if metric == "macro_f1":
        return np.asarray(f1.mean(axis=1), dtype=np.float64)
    return np.asarray((f1 * support).sum(axis=1) / n, dtype=np.float64)  # weighted_f1


def paired_bootstrap(
    true: Sequence[int],
    preds_a: Sequence[Sequence[int]],
    preds_b: Sequence[Sequence[int]],
    n_labels: int,
    metric: str = "macro_f1",
    resamples: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> Difference:
    """A - B of the seed-mean `metric`, with its percentile interval over item resamples.
    `preds_a` / `preds_b`: one prediction list per seed, each aligned with `true`."""
    _check_metric(metric)
    if resamples < 1 or not 0 < level < 1:
        raise DataError(f"resamples={resamples}, level={level}", "resamples >= 1, 0 < level < 1")
    y = np.asarray(true, dtype=np.int64)
    a = [np.asarray(p, dtype=np.int64) for p in preds_a]
    b = [np.asarray(p, dtype=np.int64) for p in preds_b]
    if not a or not b or any(len(p) != len(y) for p in a + b):
        raise DataError("every seed needs one prediction per item", "score both on the same set")
    if not len(y):
        raise DataError("no items to compare on")
    if any(v.min() < 0 or v.max() >= n_labels for v in (y, *a, *b)):
        raise DataError(f"a label id outside 0..{n_labels - 1}", "give the full label list")
    rng = np.random.default_rng(seed)
    full = np.arange(len(y))[None, :]

    def mean_score(preds: list[np.ndarray], index: np.ndarray) -> np.ndarray:
        return np.mean([resampled_scores(y, p, index, n_labels, metric) for p in preds], axis=0)

    diffs = []
    for start in range(0, resamples, CHUNK):
        index = rng.integers(0, len(y), size=(min(CHUNK, resamples - start), len(y)))
        diffs.append(mean_score(a, index) - mean_score(b, index))
    d = np.concatenate(diffs)
    score_a, score_b = float(mean_score(a, full)[0]), float(mean_score(b, full)[0])
    tail = (1 - level) / 2
    return Difference(
        a=score_a,
        b=score_b,
        diff=score_a - score_b,
        low=float(np.quantile(d, tail)),
        high=float(np.quantile(d, 1 - tail)),
        not_above=float((d <= 0).mean()),
        level=level,
        resamples=resamples,
        items=len(y),
    )


def require_part(row: dict[str, Any], part: str) -> None:
    """A part the run never scored (a typo, or advts without --eval-also) is named as such:
    running the fine-tuning again would not add it."""
    kept = sorted(row.get("targets") or {})
    if kept and part not in kept:
        raise DataError(
            f"{row.get('dataset')} {row.get('system')}: its results.json holds no {part!r} part "
            f"(it has: {', '.join(kept)})",
            "choose one of those with --part; an extra test set such as advts is scored "
            "when the fine-tuning ran with --eval-also advts",
        )


def row_predictions(row: dict[str, Any], part: str) -> tuple[list[int], list[list[int]]]:
    """The targets and per-seed predictions a results.json row kept for `part`."""
    name = f"{row.get('dataset')} {row.get('system')}"
    targets = row.get("targets", {}).get(part)
    preds = [s.get("predictions", {}).get(part) for s in row.get("seeds", [])]
    if not targets or not row.get("labels") or not preds or any(p is None for p in preds):
        require_part(row, part)
        raise DataError(
            f"{name}: no item-level {part} predictions in its results.json",
            "run its fine-tuning command again with this version: finished seeds are "
            "re-scored from their saved classifiers, not trained again",
        )
    return list(targets), [list(p) for p in preds]


def compare_rows(
    row_a: dict[str, Any],
    row_b: dict[str, Any],
    part: str = "test",
    metric: str = "macro_f1",
    resamples: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> Difference:
    """`paired_bootstrap` of two results.json rows, refusing rows scored on different items."""
    true_a, preds_a = row_predictions(row_a, part)
    true_b, preds_b = row_predictions(row_b, part)
    if row_a.get("dataset") != row_b.get("dataset"):  # as many items with the same labels
        # (two sets sorted by label, a set in two text forms) would pass the check below
        raise DataError(
            f"{row_a['dataset']} {row_a['system']} and {row_b['dataset']} {row_b['system']} "
            "were fine-tuned and scored on different datasets",
            "compare results of one dataset and split",
        )
    if _dataset_folder(row_a) != _dataset_folder(row_b):  # two folders of one name
        raise DataError(
            f"{row_a['system']} and {row_b['system']} read different sets named "
            f"{row_a['dataset']} ({_dataset_folder(row_a) or 'the shipped set'} against "
            f"{_dataset_folder(row_b) or 'the shipped set'})",
            "compare results of one dataset and split",
        )
    if row_a.get("labels") != row_b.get("labels"):  # ids that name other classes
        raise DataError(
            f"{row_a['system']} and {row_b['system']} number their labels differently "
            f"({', '.join(row_a['labels'])} against {', '.join(row_b['labels'])})",
            "compare results fine-tuned on one dataset's label list",
        )
    if true_a != true_b:
        raise DataError(
            f"{row_a['system']} and {row_b['system']} were not scored on the same {part} items "
            f"({row_a['dataset']}: {len(true_a)}, {row_b['dataset']}: {len(true_b)})",
            "compare results of one dataset and split",
        )
    labels = len(row_a["labels"])
    return paired_bootstrap(true_a, preds_a, preds_b, labels, metric, resamples, level, seed)


def _recipe(system: str) -> str:
    """A system's name without its model folder's (`finetune.system_name` writes it only after
    "albert-pretrained" / "albert-random"): runs of one recipe on other pretraining seeds come
    from folders named apart. Other parentheses name the system ("textcnn-pieces(scratch)")."""
    return re.sub(r"^(albert-(?:pretrained|random))\([^()]*\)", r"\1()", system)


def pool_rows(
    rows: Sequence[dict[str, Any]],
    part: str | None = None,
    against: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One system's results from several runs (e.g. its pretraining seeds) as one row whose
    seeds are all of theirs, for `compare_rows`; refused unless every run is the same system
    (the model folder's name aside) scored on the same items: those of `part` only, when
    given (the pooled row then holds that part's targets alone), or of every part. `against`:
    the row they are compared with, which must not be among them (A - B would read B's own
    seeds as A's)."""
    if against is not None and against in rows:
        raise DataError(
            f"{against['dataset']} {against['system']}: system B is also among A's runs (one of "
            "them holds B's results, seed for seed: the same folder, a copy, or a rerun that "
            "came out identical)",
            "--pool names other runs of system A, --pool-b of system B: a run is on one side",
        )

    def targets(row: dict[str, Any]) -> Any:
        kept = row.get("targets") or {}
        return kept if part is None else {part: kept.get(part)}

    first = rows[0]
    if part is not None:
        for row in rows:
            require_part(row, part)
    for i, row in enumerate(rows):  # one run twice would weigh its seeds double in the mean
        if row in rows[:i]:
            raise DataError(
                f"{row['dataset']} {row['system']}: the same results are given twice (the same "
                "folder, a copy, or a rerun that came out identical, seed for seed)",
                "pool each run once (--pool names runs other than A)",
            )
    for row in rows[1:]:
        same = row["dataset"] == first["dataset"] and _recipe(row["system"]) == _recipe(
            first["system"]
        )
        same = same and _dataset_folder(row) == _dataset_folder(first)
        if not same or targets(row) != targets(first) or row.get("labels") != first.get("labels"):
            raise DataError(
                f"{row['dataset']} {row['system']} cannot be pooled with "
                f"{first['dataset']} {first['system']}" + (f" on {part}" if part else ""),
                "pool runs of one system on one dataset and split",
            )
        # fewer labelled examples (finetune.limit_train) make another system, not another
        # run of it (`report.select_best` keeps them apart too): their seeds are not one mean
        if _train_size(row) != _train_size(first):
            raise DataError(
                f"{row['dataset']} {row['system']} was fine-tuned on {_train_size(row)} "
                f"labelled examples, {first['dataset']} {first['system']} on "
                f"{_train_size(first)}: they cannot be pooled",
                "pool runs fine-tuned on the same training examples (finetune.limit_train)",
            )
    return {**first, "targets": targets(first), "seeds": [s for row in rows for s in row["seeds"]]}


def pool_pair(
    runs_a: Sequence[dict[str, Any]], runs_b: Sequence[dict[str, Any]], part: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Systems A and B, each from its runs (`pool_rows` on `part`); refused when one run is on
    both sides, which would count its seeds for A and for B."""
    for run in runs_b:
        pool_rows(runs_a, part, run)
    return pool_rows(runs_a, part), pool_rows(runs_b, part)


def _dataset_folder(row: dict[str, Any]) -> str:
    """The folder a set of one's own was read from ("" for a shipped set): sets are named by
    their folder, so two folders of one name give rows of one dataset name."""
    notes = row.get("notes") or {}
    return str(notes.get("dataset_folder") or "") if isinstance(notes, dict) else ""


def _train_size(row: dict[str, Any]) -> int | None:
    """The labelled training examples a results.json row was fine-tuned on (None: not kept)."""
    sizes = (row.get("notes") or {}).get("sizes")
    return sizes.get("train") if isinstance(sizes, dict) else None
