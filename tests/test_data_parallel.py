"""Two CPU processes (torchrun, gloo) with the same global batch reach the same parameters as
one process that accumulates the same two micro-batches.

Dropout is off here: with it, rank 1 draws its masks from its own RNG stream while the single
process continues one stream, so the runs would differ by design, not by a bug."""

from __future__ import annotations

import json
from pathlib import Path

import engine_harness as h
import pytest
import torch

CONFIG = {
    "max_steps": 5,
    "batch_size": 8,
    "micro_batch_size": 4,
    "checkpoint_every": 5,
    "dropout": 0.0,
}


@pytest.mark.slow
@pytest.mark.parametrize("zero_stage", [0, 2])
def test_two_processes_match_one(tmp_path: Path, zero_stage: int) -> None:
    config = {**CONFIG, "zero_stage": zero_stage}
    done = h.torchrun(tmp_path / "two", config)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    h.main(tmp_path / "one", config)  # this process: world 1, accumulation 2

    two = json.loads((tmp_path / "two" / "result.json").read_text())
    one = json.loads((tmp_path / "one" / "result.json").read_text())
    assert (two["world"], one["world"]) == (2, 1)
    a = torch.load(tmp_path / "two" / "weights.pt", weights_only=True)
    b = torch.load(tmp_path / "one" / "weights.pt", weights_only=True)
    start = h.TinyPretrainer().state_dict()
    for key in a:
        # Float tolerance: the gradient all-reduce sums in another order than accumulation.
        assert torch.allclose(a[key], b[key], rtol=1e-5, atol=1e-6), key
    assert not torch.allclose(a["mlm.weight"], start["mlm.weight"])  # it did train
    for k in ("train/loss", "train/mask_accuracy", "train/sop_loss"):
        assert two["train"][k] == pytest.approx(one["train"][k], rel=1e-5)
