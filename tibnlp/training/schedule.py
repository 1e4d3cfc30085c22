"""Learning-rate schedules: linear warmup, then linear or cosine decay to `min_lr_ratio`.

A plain `LambdaLR` so DeepSpeed checkpoints it with the engine (its state is just the step).

Budget-aware (as in cramming): under a wall-clock budget the training loop tells the
schedule the fraction of the budget spent (`set_time_fraction`), and warmup and decay follow
whichever is further along, steps or time. A run stopped by its budget therefore ends at the
final learning rate instead of being cut mid-schedule with the rate still high.
"""

from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from tibnlp.config.train import OptimizerConfig, parse_duration

__all__ = ["LrFactor", "WarmupDecay", "build_scheduler", "lr_factor", "parse_duration"]


def lr_factor(
    step: int,
    warmup: int,
    total: int,
    kind: str = "linear",
    min_ratio: float = 0.0,
    time_fraction: float = 0.0,
) -> float:
    """Multiplier of the peak lr before optimizer step `step` (0-based).

    `time_fraction`: the share of a wall-clock budget already spent (0 without one). Warmup
    covers the first `warmup / total` of the run and decay the rest, measured in steps or in
    time, whichever is further along."""
    total = max(1, total)
    warm_share = warmup / total
    time_fraction = min(1.0, max(0.0, time_fraction))
    if warmup > 0 and step < warmup and time_fraction < warm_share:
        return max((step + 1) / warmup, time_fraction / warm_share)
    if kind == "constant":
        return 1.0
    by_steps = (step - warmup) / max(1, total - warmup)
    by_time = (time_fraction - warm_share) / max(1e-12, 1.0 - warm_share)
    progress = min(1.0, max(0.0, by_steps, by_time))
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
        self.time_fraction = 0.0

    def __call__(self, step: int) -> float:
        return lr_factor(
            step, self.warmup, self.total, self.kind, self.min_ratio, self.time_fraction
        )


class WarmupDecay(LambdaLR):
    """LambdaLR whose checkpoint holds only the position, not the shape: resuming with a new
    `max_steps` (to train longer) follows the new schedule from the saved step.

    `peak_lr`: the optimizer's own lr (`optimizer.lr`), which parameters without a rate of
    their own train at; checkpointed with the base rates it goes with."""

    def __init__(self, optimizer: Optimizer, factor: LrFactor, peak_lr: float) -> None:
        self.peak_lr = peak_lr
        super().__init__(optimizer, factor)

    def optimizer_lr(self) -> float:
        """`peak_lr` as the schedule sets it for the coming update. What a run logs as its lr:
        param group 0 may hold other rates (groups exist only where they have parameters: with
        layer decay and a head rate, group 0 is the embedding's, the lowest)."""
        group, base = self.optimizer.param_groups[0], self.base_lrs[0]
        return self.peak_lr * group["lr"] / base  # every group shares the schedule's factor

    def state_dict(self) -> dict:
        state = super().state_dict()
        state.pop("lr_lambdas", None)
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        state = {k: v for k, v in state_dict.items() if k != "lr_lambdas"}
        self.__dict__.update(state)

    def set_time_fraction(self, fraction: float) -> None:
        """Share of the budget spent (time or tokens, whichever is further along: the loop
        decides); re-applies the lr of the coming update."""
        for factor in self.lr_lambdas:
            if isinstance(factor, LrFactor):
                factor.time_fraction = fraction
        for group, base, factor in zip(
            self.optimizer.param_groups, self.base_lrs, self.lr_lambdas, strict=True
        ):
            group["lr"] = base * factor(self.last_epoch)


def build_scheduler(optimizer: Optimizer, cfg: OptimizerConfig, total_steps: int) -> LambdaLR:
    return WarmupDecay(
        optimizer,
        LrFactor(cfg.warmup_steps, total_steps, cfg.schedule, cfg.min_lr_ratio),
        cfg.lr,
    )
