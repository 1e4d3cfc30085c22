"""Which metrics are counts of texts or fractions, and how a table shows them: the one rule of
every table.

Most metrics are fractions (F1, accuracy, a flip rate), shown x100 as percentages and with their
spread over seeds. A few are counts: the texts a flip rate leaves out (`*_flip_excluded`) and
the texts and pieces the cut at the read length takes (`cut_*`, logged on the parent run). A
count x100 reads as a rate it is not, and every seed of a run cuts the same texts, so its
"± 0.00" claims a spread there is none of: a count is shown as it is, once when the seeds agree.
Losses, token counts and the like are neither: shown as logged, never x100 (`is_fraction`).
"""

from __future__ import annotations

import math

COUNT_SUFFIXES = ("_flip_excluded",)
COUNT_PREFIXES = ("cut_",)
# what the parent run of a fine-tuning adds to a seed metric's name (its aggregate over seeds)
AGGREGATE_SUFFIXES = ("_mean", "_std")
# the endings of the metrics that are fractions: what `--percent` shows x100
FRACTION_ENDINGS = ("f1", "precision", "recall", "accuracy", "_flip_rate", "_share", "_fraction")


def is_count(metric: str) -> bool:
    """Whether `metric` (as logged: `test_shad_flip_excluded`, its parent's `..._mean`, or a
    results.json aggregate's `shad_flip_excluded`) counts texts or pieces."""
    for suffix in AGGREGATE_SUFFIXES:
        if metric.endswith(suffix) and is_count(metric.removesuffix(suffix)):
            return True
    return metric.startswith(COUNT_PREFIXES) or metric.endswith(COUNT_SUFFIXES)


def is_fraction(metric: str) -> bool:
    """Whether `metric` (as `is_count` reads names) is a fraction in [0, 1], which `--percent`
    shows x100 as papers print F1; a loss or a number of tokens x100 would read as what it is
    not."""
    for suffix in AGGREGATE_SUFFIXES:
        if metric.endswith(suffix) and is_fraction(metric.removesuffix(suffix)):
            return True
    return metric.endswith(FRACTION_ENDINGS)


def count_text(mean: float, std: float) -> str:
    """A count over seeds: once when they agree (no spread), else its mean ± std to a tenth."""
    if not std or math.isnan(std):  # (NaN: no spread known, as for one seed)
        return f"{mean:.0f}" if float(mean).is_integer() else f"{mean:.1f}"
    return f"{mean:.1f} ± {std:.1f}"
