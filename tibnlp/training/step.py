"""One optimizer step and one held-out evaluation, as every rank runs them on the engine.

Per optimizer step, every rank runs its micro-batches, then one all-reduce carries the
metrics, the token count and the "out of time" flag, so all ranks agree on when to stop and
on whether the loss is finite before any rank applies the update.

The update is the mean of the micro-batches' mean losses (DeepSpeed scales each by
1/accumulation, and averages ranks' gradients), as BERT's and ALBERT's per-replica means
were: a micro-batch with fewer masked pieces weighs each of them more than one batch of the
same examples would (tests/test_engine.py, accumulation test). Length-bucketed batches keep
the masked counts of a step's micro-batches close.

When to step, evaluate, log, checkpoint and stop is the loop's (`loop.TrainLoop`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from tibnlp.errors import TibnlpError
from tibnlp.training.batches import ShardedBatches
from tibnlp.training.engine import World, all_reduce_sum

EVAL_RNG_SEED = 0  # the global RNG's seed for every held-out evaluation


class TrainingDiverged(TibnlpError):
    """The loss or the weights stopped being finite."""


def _metric_keys(out: dict[str, Any]) -> list[str]:
    keys = [k for k, v in out.items() if isinstance(v, torch.Tensor) and v.dim() == 0]
    if "loss" not in keys:
        raise TypeError("the model's forward must return a dict with a scalar 'loss'")
    return sorted(keys)


def _on(value: torch.Tensor, device: Any) -> torch.Tensor:
    """A scalar metric as float64 on the engine's device (a model may return a count on the
    CPU beside values on the GPU)."""
    return value.detach().to(device=device, dtype=torch.float64)


def _tokens(batch: dict[str, torch.Tensor]) -> float:
    mask = batch.get("attention_mask")
    if mask is not None:
        return float(mask.sum())
    return float(next(iter(batch.values())).numel())


class EngineStep:
    """The engine's side of training: `engine(**micro_batch)` returns a dict whose 0-d
    tensors are metrics (`keys`, fixed by the first forward) and whose "loss" is optimised."""

    def __init__(self, engine: Any, world: World) -> None:
        self.engine, self.world = engine, world
        self.keys: list[str] = []

    def to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        device = self.engine.device
        return {k: v.to(device, non_blocking=True) for k, v in batch.items()}

    def _reduce(self, sums: torch.Tensor, count: int, extra: list[float]) -> torch.Tensor:
        packed = torch.cat([sums / count, torch.tensor(extra, dtype=torch.float64)])
        return all_reduce_sum(packed)

    def train(
        self, micro_batches: list[dict[str, torch.Tensor]], over_budget: bool, step: int
    ) -> tuple[dict[str, float], float, bool]:
        """Optimizer step number `step`; returns (metrics, tokens across ranks, stop flag)."""
        sums: torch.Tensor | None = None
        tokens = 0.0
        for i, raw in enumerate(micro_batches):
            batch = self.to_device(raw)
            out = self.engine(**batch)
            if not self.keys:
                self.keys = _metric_keys(out)
            self.engine.backward(out["loss"])
            # on the device: one copy to the host a step, not one per metric and micro-batch
            values = torch.stack([_on(out[k], self.engine.device) for k in self.keys])
            sums = values if sums is None else sums + values
            tokens += _tokens(raw)
            if i < len(micro_batches) - 1:
                self.engine.step()  # inside accumulation: no update yet
        assert sums is not None
        reduced = self._reduce(sums.cpu(), len(micro_batches), [tokens, float(over_budget)])
        n = len(self.keys)
        metrics = {
            k: float(v) / self.world.size for k, v in zip(self.keys, reduced[:n], strict=True)
        }
        if not math.isfinite(metrics["loss"]):
            raise TrainingDiverged(
                f"loss is {metrics['loss']} at step {step}; the update was not applied "
                "and the last good checkpoint is untouched",
                "lower pretrain.optimizer.lr, raise warmup_steps or check the data; "
                "then --resume from the last checkpoint",
            )
        metrics["lr"] = self._lr()  # the lr this update uses
        self.engine.step()
        return metrics, float(reduced[n]), bool(reduced[n + 1] > 0)

    def _lr(self) -> float:
        """optimizer.lr as the schedule sets it (`WarmupDecay.optimizer_lr`), not param group
        0's rate, which under per-prefix rates may be any group's (the embedding's)."""
        scheduler: Any = getattr(self.engine, "lr_scheduler", None)
        if hasattr(scheduler, "optimizer_lr"):
            return float(scheduler.optimizer_lr())
        return float(self.engine.get_lr()[0])

    @torch.no_grad()
    def held_out(self, eval_data: ShardedBatches, batches: int) -> dict[str, float]:
        """The mean metrics over the first `batches` held-out batches (fixed masks)."""
        self.engine.eval()
        eval_data.reset()
        sums: torch.Tensor | None = None
        count = 0
        keys = self.keys
        # a model that samples in eval mode (ELECTRA's generator) draws the same at every
        # evaluation, and the training streams are left as they were
        device = torch.device(self.engine.device)
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.random.default_generator.manual_seed(EVAL_RNG_SEED)
            if device.type == "cuda":
                torch.cuda.manual_seed(EVAL_RNG_SEED)  # this process's device only
            for _ in range(min(batches, len(eval_data))):
                for raw in eval_data.next():
                    out = self.engine(**self.to_device(raw))
                    keys = keys or _metric_keys(out)
                    values = torch.stack([_on(out[k], self.engine.device) for k in keys])
                    sums = values if sums is None else sums + values
                    count += 1
        self.engine.train()
        if sums is None:
            return {}
        reduced = self._reduce(sums.cpu(), count, [])
        return {k: float(v) / self.world.size for k, v in zip(keys, reduced, strict=True)}

    def weights_finite(self) -> bool:
        """Whether every rank's weights are finite (collective)."""
        bad = sum(
            0 if bool(torch.isfinite(p).all()) else 1 for p in self.engine.module.parameters()
        )
        return float(all_reduce_sum(torch.tensor([float(bad)], dtype=torch.float64))[0]) == 0
