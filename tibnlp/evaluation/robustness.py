"""How much a classifier's predictions depend on how a text ends, not on what it says.

TNCC titles never end with a shad; texts typed by users usually do. The flip rate of a suffix
is the fraction of test predictions that change when the suffix is appended to every test
text (before the classifier's own normalisation, as `tibnlp predict` would receive it). A
classifier that ignores closing punctuation scores 0.
"""

from __future__ import annotations

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
    predict: Callable[[list[str]], list[int]], texts: Sequence[str], predictions: Sequence[int]
) -> dict[str, float]:
    """`{name}_flip_rate` for each of `SUFFIXES`: `predict` takes raw texts (it normalises them
    as prediction does); `predictions` are its answers for `texts` as they are."""
    return {
        f"{name}_flip_rate": flip_rate(predictions, predict([typed(t, s) for t in texts]))
        for name, s in SUFFIXES.items()
    }
