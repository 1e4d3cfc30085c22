"""A resumable, rank-sharded batch source.

Every rank builds the same global batch plan for an epoch (a list of example-index lists, e.g.
from length bucketing) and takes its own contiguous slice of each global batch, split into
micro-batches for gradient accumulation. The position (epoch, batch in epoch, batches served)
is three integers saved in the checkpoint, so resuming jumps straight there.

Each micro-batch is collated with a key unique to its place in the global batch
(`served * parts + rank * accumulation + micro`), so random masking depends only on the seed and
that key: one process accumulating two micro-batches sees exactly what two processes see.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

Plan = Callable[[int], Sequence[Sequence[int]]]
Collate = Callable[[Sequence[int], int], dict[str, torch.Tensor]]


@dataclass
class DataPosition:
    epoch: int = 0
    index: int = 0  # next global batch within the epoch's plan
    served: int = 0  # global batches handed out so far (all epochs)


class ShardedBatches:
    def __init__(
        self,
        plan: Plan,
        collate: Collate,
        batch_size: int,
        rank: int,
        world_size: int,
        accumulation: int,
    ) -> None:
        if batch_size % (world_size * accumulation):
            raise ValueError("batch_size must divide into processes x accumulation steps")
        self.plan, self.collate = plan, collate
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.accumulation = accumulation
        self.micro = batch_size // (world_size * accumulation)
        self.position = DataPosition()
        self._plans: dict[int, list[list[int]]] = {}

    def _epoch_plan(self, epoch: int) -> list[list[int]]:
        if epoch not in self._plans:
            # Only full global batches: every rank must get the same number of examples.
            full = [list(b) for b in self.plan(epoch) if len(b) == self.batch_size]
            if not full:
                raise ValueError(f"the data yields no full batch of {self.batch_size} examples")
            self._plans = {epoch: full}
        return self._plans[epoch]

    def __len__(self) -> int:
        """Global batches in the current epoch."""
        return len(self._epoch_plan(self.position.epoch))

    def next(self) -> list[dict[str, torch.Tensor]]:
        """This rank's micro-batches of the next global batch."""
        pos = self.position
        plan = self._epoch_plan(pos.epoch)
        if pos.index >= len(plan):
            pos.epoch, pos.index = pos.epoch + 1, 0
            plan = self._epoch_plan(pos.epoch)
        batch = plan[pos.index]
        parts = self.world_size * self.accumulation
        out = []
        for micro in range(self.accumulation):
            part = self.rank * self.accumulation + micro
            indices = batch[part * self.micro : (part + 1) * self.micro]
            out.append(self.collate(indices, pos.served * parts + part))
        pos.index += 1
        pos.served += 1
        return out

    def reset(self) -> None:
        """Back to the start (evaluation reuses the same batches and masks every time)."""
        self.position = DataPosition()

    def state_dict(self) -> dict[str, Any]:
        return asdict(self.position)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = DataPosition(**{k: int(v) for k, v in state.items()})
