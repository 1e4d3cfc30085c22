"""Keep-best selection (tibnlp.training.keep_best): the weights of the best evaluation are
put back, and patience counts evaluations that did not beat it."""

from __future__ import annotations

import math

import torch

from tibnlp.training.keep_best import KeepBest


def _scores(keep: KeepBest, values: list[float]) -> list[bool]:
    module = torch.nn.Linear(1, 1, bias=False)
    kept = []
    for step, value in enumerate(values):
        with torch.no_grad():
            module.weight.fill_(float(step))
        kept.append(keep.offer({"macro_f1": value}, module))
    keep.restore(module)
    kept.append(float(module.weight.detach()))  # type: ignore[arg-type]
    return kept


def test_the_best_weights_come_back_and_patience_runs_out() -> None:
    keep = KeepBest("macro_f1", patience=2)
    assert _scores(keep, [0.3, 0.5, 0.5, 0.4]) == [True, True, False, False, 1.0]
    assert keep.out_of_patience and keep.value == 0.5


def test_a_nan_score_neither_beats_the_best_nor_is_beaten() -> None:
    """A diverged evaluation (NaN) must not replace a finite best: its weights would be
    restored, and any later score would look like a gain over it."""
    keep = KeepBest("macro_f1")
    assert _scores(keep, [0.5, math.nan, 0.4]) == [True, False, False, 0.0]
    assert keep.stale == 2
