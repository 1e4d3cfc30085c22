"""How much a classifier's predictions depend on how a text ends, not on what it says.

TNCC titles never end with a shad; texts typed by users usually do. The flip rate of a suffix
is the fraction of test predictions that change when the suffix is appended to every test
text (before the classifier's own normalisation, as `tibnlp predict` would receive it). A
classifier that ignores closing punctuation scores 0. Texts whose suffix the classifier never
reads (cut at its read length) are left out of the rate and counted beside it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

SHAD, TSHEG, NGA = "\u0f0d", "\u0f0b", "\u0f44"
# name -> what a user appends (as `typed` writes it); the metric is `<part>_<name>_flip_rate`
SUFFIXES = {"shad": SHAD, "tsheg": TSHEG}


def typed(text: str, suffix: str) -> str:
    """`text` ended with `suffix` as a user would type it: a shad after a final ང takes a
    tsheg before it (ང་།), as Tibetan orthography writes it, not a bare ང།."""
    if suffix == SHAD and text.endswith(NGA):
        return text + TSHEG + SHAD
    return text + suffix


def flip_rate(before: Sequence[int], after: Sequence[int]) -> float:
    """Fraction of positions whose prediction differs (0.0 for no predictions)."""
    if len(before) != len(after):
        raise ValueError(f"flip_rate: {len(before)} predictions before, {len(after)} after")
    if not before:
        return 0.0
    return sum(a != b for a, b in zip(before, after, strict=True)) / len(before)


def suffix_flip_rates(
    predict: Callable[[list[str]], tuple[list[int], list[int]]],
    texts: Sequence[str],
    predictions: Sequence[int],
) -> dict[str, float]:
    """`{name}_flip_rate` for each of `SUFFIXES`, and `{name}_flip_excluded`: how many texts it
    leaves out. `predict` takes raw texts (it normalises them as prediction does) and gives its
    answers and the pieces each text lost to the cut at the read length; `predictions` are its
    answers for `texts` as they are.

    A text whose suffixed form is cut is left out: the classifier never reads the suffix (or
    all of it), so its unchanged answer says nothing about robustness, and counting it as not
    flipped would make a classifier that reads less look more robust. With every text left
    out the rate is NaN (not known), not 0."""
    rates = {}
    for name, suffix in SUFFIXES.items():
        after, dropped = predict([typed(t, suffix) for t in texts])
        read = [i for i, d in enumerate(dropped) if not d]
        kept = [predictions[i] for i in read], [after[i] for i in read]
        rates[f"{name}_flip_rate"] = flip_rate(*kept) if read else math.nan
        rates[f"{name}_flip_excluded"] = float(len(texts) - len(read))
    return rates
