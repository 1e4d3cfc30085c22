"""Prefetching the next batch (`training/prefetch.py`, on by default on a GPU) changes neither
the batches nor what a checkpoint resumes from, and the loop trains the same with it."""

from __future__ import annotations

from pathlib import Path

import engine_harness as h
import pytest
import torch

from tibnlp.training.batches import ShardedBatches
from tibnlp.training.prefetch import Prefetched


def _source() -> ShardedBatches:
    def plan(epoch: int) -> list[list[int]]:
        order = [(i * (epoch + 5)) % 12 for i in range(12)]  # another order each epoch
        return [order[i : i + 4] for i in range(0, 12, 4)]

    def collate(indices, key: int) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
        g = torch.Generator().manual_seed(key)
        return {"ids": torch.tensor(indices), "noise": torch.rand(2, generator=g)}

    return ShardedBatches(plan, collate, 4, 0, 1, 2)


def _draws(source, n: int) -> list[list[dict[str, torch.Tensor]]]:  # type: ignore[no-untyped-def]
    return [source.next() for _ in range(n)]


def _same(a, b) -> bool:  # type: ignore[no-untyped-def]
    return all(
        x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
        for ma, mb in zip(a, b, strict=True)
        for x, y in zip(ma, mb, strict=True)
    )


def test_prefetched_batches_and_positions_equal_the_plain_source() -> None:
    plain, ahead = _source(), Prefetched(_source(), pin=False)
    assert _same(_draws(plain, 5), _draws(ahead, 5))  # across an epoch boundary
    # the saved position is after the handed-out batches, not after the prefetched one
    assert ahead.state_dict() == plain.state_dict()
    resumed = Prefetched(_source(), pin=False)
    resumed.load_state_dict(ahead.state_dict())
    expected = _draws(plain, 4)
    assert _same(_draws(resumed, 4), expected)
    assert _same(_draws(ahead, 4), expected)  # the original goes on alike


def test_the_loop_trains_the_same_with_prefetching(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tibnlp.training.loop as loop

    made: list[Prefetched] = []

    class Spy(Prefetched):  # the loop's prefetcher, counted: the setting must reach it
        def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(loop, "Prefetched", Spy)
    config = {"max_steps": 4, "checkpoint_every": 2, "eval_every": 2, "seed": 5}
    h.main(tmp_path / "plain", {**config, "prefetch": False})
    assert not made
    h.main(tmp_path / "ahead", {**config, "prefetch": True})
    assert len(made) == 1
    a = torch.load(tmp_path / "ahead" / "weights.pt", weights_only=True)
    b = torch.load(tmp_path / "plain" / "weights.pt", weights_only=True)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
