"""The next global batch collated (and pinned, for a GPU) in a background thread while the
current step runs, so the device does not wait on Python collation between steps.

Collation is a pure function of the batch's key (masking draws from a generator seeded by the
key, `batches.py`), so drawing a batch early on another thread changes nothing that is trained.
The checkpointed position is the one after the batches handed out: a batch prefetched but not
yet trained on is drawn again after a resume, the same as it would have been.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from tibnlp.training.batches import ShardedBatches

Micro = list[dict[str, torch.Tensor]]


class Prefetched:
    """`ShardedBatches` (its next/state_dict/load_state_dict) one global batch ahead."""

    def __init__(self, source: ShardedBatches, pin: bool) -> None:
        self.source, self.pin = source, pin
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tibnlp-prefetch")
        self._pending: Future[Micro] | None = None
        self._handed: dict[str, Any] = source.state_dict()  # position after handed-out batches

    def _draw(self) -> Micro:
        micro = self.source.next()
        if self.pin:  # page-locked: the copy to the GPU is asynchronous (non_blocking)
            micro = [{k: v.pin_memory() for k, v in b.items()} for b in micro]
        return micro

    def next(self) -> Micro:
        out = self._draw() if self._pending is None else self._pending.result()
        self._handed = self.source.state_dict()  # the source is idle between the two draws
        # a new epoch's plan runs its start hook (GEMFormer's memory refresh reads the model):
        # it is drawn on the caller's thread at the next call, after this step and evaluation
        in_epoch = self.source.position.index < len(self.source)
        self._pending = self._pool.submit(self._draw) if in_epoch else None
        return out

    def _drop(self) -> None:
        if self._pending is not None:
            self._pending.result()
            self._pending = None

    def state_dict(self) -> dict[str, Any]:
        return dict(self._handed)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._drop()
        self.source.load_state_dict(state)
        self._handed = self.source.state_dict()
