"""`start_training`: the one wiring of engine, batches and loop.

Pretraining, fine-tuning, the engine test harness and the scaling benchmark all need the same
three things to agree: the DeepSpeed engine (optimizer and schedule attached), batches cut
for this process's rank and accumulation steps, and the loop that drives them. Built here
once, so a new training task cannot pair an engine with batches sharded another way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from tibnlp.config.train import EngineConfig, OptimizerConfig
from tibnlp.training.batches import Collate, Plan, ShardedBatches
from tibnlp.training.engine import World, accumulation_steps, initialize
from tibnlp.training.loop import Evaluator, Exporter, LoopSettings, TrainLoop


@dataclass
class Training:
    """An engine with the process layout its batches must follow."""

    engine: Any
    world: World
    accumulation: int  # micro-steps per optimizer step on each process

    def batches(self, plan: Plan, collate: Collate, batch_size: int) -> ShardedBatches:
        """Global batches of `plan`, this process's slice, in micro-batches."""
        w = self.world
        return ShardedBatches(plan, collate, batch_size, w.rank, w.size, self.accumulation)

    def loop(
        self,
        train: ShardedBatches,
        heldout: ShardedBatches | None,
        settings: LoopSettings,
        evaluator: Evaluator | None = None,
        exporter: Exporter | None = None,
    ) -> TrainLoop:
        return TrainLoop(self.engine, self.world, train, heldout, settings, evaluator, exporter)


def start_training(
    model: nn.Module,
    engine_cfg: EngineConfig,
    optimizer: OptimizerConfig,
    batch_size: int,
    micro_batch_size: int,
    total_steps: int,
    world: World,
    lr_by_prefix: Mapping[str, float] | None = None,
) -> Training:
    """The engine around `model` (`engine.initialize`) and the accumulation its batches use;
    `batch_size` is global, `micro_batch_size` per process (0: no accumulation)."""
    accumulation = accumulation_steps(batch_size, micro_batch_size, world.size)
    engine = initialize(
        model,
        engine_cfg,
        optimizer,
        batch_size,
        micro_batch_size,
        total_steps,
        world,
        lr_by_prefix,
    )
    return Training(engine, world, accumulation)
