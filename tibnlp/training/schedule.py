"""Learning-rate schedules: linear warmup, then linear or cosine decay to `min_lr_ratio`.

A plain `LambdaLR` so DeepSpeed checkpoints it with the engine (its state is just the step).
"""

from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from tibnlp.config.train import OptimizerConfig, parse_duration

__all__ = ["LrFactor", "WarmupDecay", "build_scheduler", "lr_factor", "parse_duration"]


def lr_factor(
    step: int, warmup: int, total: int, kind: str = "linear", min_ratio: float = 0.0
) -> float:
    """Multiplier of the peak lr before optimizer step `step` (0-based)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if kind == "constant":
        return 1.0
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    if kind == "cosine":
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    elif kind == "linear":
        decay = 1.0 - progress
    else:
        raise ValueError(f"unknown schedule {kind!r}")
    return min_ratio + (1.0 - min_ratio) * decay


class LrFactor:
    """Picklable callable for LambdaLR (a lambda would not survive `state_dict`)."""

    def __init__(self, warmup: int, total: int, kind: str, min_ratio: float) -> None:
        self.warmup, self.total, self.kind, self.min_ratio = warmup, total, kind, min_ratio

    def __call__(self, step: int) -> float:
        return lr_factor(step, self.warmup, self.total, self.kind, self.min_ratio)


class WarmupDecay(LambdaLR):
    """LambdaLR whose checkpoint holds only the position, not the shape: resuming with a new
    `max_steps` (to train longer) follows the new schedule from the saved step."""

    def state_dict(self) -> dict:
        state = super().state_dict()
        state.pop("lr_lambdas", None)
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        state = {k: v for k, v in state_dict.items() if k != "lr_lambdas"}
        self.__dict__.update(state)


def build_scheduler(optimizer: Optimizer, cfg: OptimizerConfig, total_steps: int) -> LambdaLR:
    return WarmupDecay(
        optimizer, LrFactor(cfg.warmup_steps, total_steps, cfg.schedule, cfg.min_lr_ratio)
    )
