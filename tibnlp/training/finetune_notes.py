"""What a fine-tuning run records beside its scores: the pretraining behind its encoder (so a
learning curve can place it) and whether it learned at all (so a collapsed classifier is not
read as a result)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from tibnlp.config.finetune import FinetuneConfig
from tibnlp.errors import DataError
from tibnlp.evaluation.metrics import not_learning
from tibnlp.models.io import read_extra
from tibnlp.tracking import Tracker
from tibnlp.tracking.conventions import TAG_WARNING, WARNING_MAJORITY


def pretraining_of(ft: FinetuneConfig) -> dict[str, Any]:
    """The model directory's pretraining record (`read_extra`: step, tokens, seconds, FLOPs,
    hardware, processes); {} without a directory, or for a baseline whose directory (read for
    its shape or vocabulary only) has no weights file."""
    if not ft.model_dir:
        return {}
    try:
        return read_extra(Path(ft.model_dir))
    except DataError:
        if not ft.random_init:
            raise
        return {}


def warn_if_majority(run: Tracker, system: str, seed: int, score: float, majority: float) -> bool:
    """Say so (a warning line, tag `warning=majority_class`) when a seed's validation macro-F1
    stayed at the majority-class level; True when it did."""
    if not not_learning(score, majority):
        return False
    message = (
        f"{system} seed {seed} is not learning: validation macro-F1 {score:.2%} is at the "
        f"majority-class level ({majority:.2%}): it predicts (nearly) one class; its scores are "
        "not a result (check finetune.optimizer.lr and finetune.epochs)"
    )
    print(f"warning: {message}", file=sys.stderr, flush=True)
    run.set_tags({TAG_WARNING: WARNING_MAJORITY, "warning.detail": message})
    return True
