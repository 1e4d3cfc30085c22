"""Is a pretraining run learning? The unigram level a failing run never leaves, and the check
that warns once (stderr and an MLflow tag) when held-out MLM accuracy stays near it or the
model ignores word order."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from tibnlp.evaluation.word_order import is_order_blind
from tibnlp.tracking import Tracker
from tibnlp.training.loop import Progress


def unigram_accuracy(dataset: Any, special_ids: set[int]) -> float:
    """MLM accuracy of always guessing the most frequent regular token: the level a model that
    has learnt only token frequencies reaches (the plateau a failing run never leaves)."""
    counts = np.bincount(
        np.fromiter((t for ids in dataset["input_ids"] for t in ids), dtype=np.int64)
    )
    for i in special_ids:
        if i < len(counts):
            counts[i] = 0
    total = counts.sum()
    return float(counts.max() / total) if total else 0.0


class LearningCheck:
    """Past `warn_after` of the run, warns once (stderr and an MLflow tag) when the run is not
    learning or learns only a bag of pieces:
    - at any evaluation, held-out MLM accuracy still within 1.5x of the unigram level,
      whatever the loss curve suggests;
    - at the first evaluation past the unigram level, `order_probe` (accuracy on held-out text
      as written and shuffled, logged as `eval/order_accuracy` and `eval/shuffled_accuracy`)
      says the model ignores word order (`tibnlp.evaluation.word_order`)."""

    def __init__(
        self,
        unigram: float,
        warn_after: float,
        share: Callable[[Progress], float],
        order_probe: Callable[[], tuple[float, float]] | None = None,
        say: bool = True,
    ):
        self.unigram, self.warn_after, self.share = unigram, warn_after, share
        self.order_probe = order_probe
        self.say = say  # the main process: one warning per run, not one per process
        self.tracker: Tracker | None = None
        self.warned = self.probed = False

    def __call__(self, at: Progress, scores: dict[str, float]) -> None:
        share = self.share(at)
        acc = scores.get("mask_accuracy")
        if self.warned or not self.warn_after or share < self.warn_after or acc is None:
            return
        if acc < 1.5 * self.unigram:
            self._warn(
                "not_learning",
                f"held-out MLM accuracy {acc:.2%} after {share:.0%} of the run (step {at.step}) "
                f"is still at the unigram level ({self.unigram:.2%}): this run is not learning; "
                "lower pretrain.optimizer.lr, use model.norm=pre, or check the data",
            )
            return
        if self.order_probe is None or self.probed:
            return
        self.probed = True
        in_order, shuffled = self.order_probe()
        if self.tracker is not None:
            self.tracker.log_metrics(
                {"eval/order_accuracy": in_order, "eval/shuffled_accuracy": shuffled}, at.step
            )
        if is_order_blind(in_order, shuffled, self.unigram):
            self._warn(
                "order_blind",
                f"held-out MLM accuracy is {in_order:.2%} on text as written and {shuffled:.2%} "
                f"on the same text shuffled after {share:.0%} of the run (step {at.step}): the "
                "model ignores word order and predicts from the bag of pieces around a mask; "
                "use model.position=relative (or a longer run)",
            )

    def state_dict(self) -> dict[str, bool]:
        """Saved with each checkpoint (`TrainLoop.extra_state`): once per run, not per process."""
        return {"warned": self.warned, "probed": self.probed}

    def load_state_dict(self, state: dict[str, bool]) -> None:
        self.warned = bool(state.get("warned", False))
        self.probed = bool(state.get("probed", False))

    def _warn(self, kind: str, message: str) -> None:
        self.warned = True
        if self.say:
            print(f"warning: {message}", file=sys.stderr, flush=True)
        if self.tracker is not None:
            self.tracker.set_tags({"warning": kind, "warning.detail": message})
