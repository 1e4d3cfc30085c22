"""Mean and spread over seeds: the one definition every table and plot reports.

The spread is the sample standard deviation (ddof=1) and 0.0 for a single run, so a one-seed
row reads "± 0.00" rather than NaN. Pure Python: `runs compare` uses it without scikit-learn.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def mean_std(values: Iterable[float]) -> tuple[float, float]:
    """(mean, sample std) of `values`; (NaN, NaN) when there are none."""
    xs = [float(v) for v in values]
    if not xs:
        return math.nan, math.nan
    mean = math.fsum(xs) / len(xs)
    if len(xs) == 1:
        return mean, 0.0
    # (x - mean) * (x - mean), not ** 2: a float's ** raises OverflowError where * gives inf,
    # and MLflow stores an infinite metric (a diverged loss) as 1.8e308
    return mean, math.sqrt(math.fsum((x - mean) * (x - mean) for x in xs) / (len(xs) - 1))
