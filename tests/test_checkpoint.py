"""Checkpoints: round trip through DeepSpeed, the completeness marker, rotation, safe loading."""

from __future__ import annotations

import json
import pickle
import random

import engine_harness as h
import numpy as np
import pytest
import torch

from tibnlp.errors import TibnlpError
from tibnlp.training import checkpoint


def test_rng_states_round_trip_and_load_weights_only(tmp_path) -> None:  # type: ignore[no-untyped-def]
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    state = checkpoint.rng_state()
    torch.save(state, tmp_path / "rng.pt")
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    checkpoint.set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected


def test_rotation_keeps_the_newest_and_marks_complete(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "run"
    h.main(out, {"max_steps": 8, "checkpoint_every": 2})
    ckpt = out / "checkpoints"
    assert checkpoint.latest_tag(ckpt) == "step00000008"
    assert sorted(p.name for p in ckpt.glob("step*")) == ["step00000006", "step00000008"]
    # A save interrupted after writing files but before the marker is never picked up.
    (ckpt / "step00000010").mkdir()
    assert checkpoint.latest_tag(ckpt) == "step00000008"
    (ckpt / "latest").write_text("step00000099\n")  # marker naming a missing folder
    assert checkpoint.latest_tag(ckpt) is None


def test_resume_loads_weights_and_position(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "run"
    h.main(out, {"max_steps": 4, "checkpoint_every": 2})
    first = torch.load(out / "weights.pt", weights_only=True)
    run_id = json.loads((out / "result.json").read_text())["run_id"]
    with pytest.raises(TibnlpError, match="already holds checkpoints"):
        h.main(out, {"max_steps": 6, "checkpoint_every": 2})
    h.main(out, {"max_steps": 6, "checkpoint_every": 2, "resume": True, "zero_stage": 0})
    result = json.loads((out / "result.json").read_text())
    assert result["step"] == 6 and result["run_id"] == run_id  # same MLflow run
    state = torch.load(
        out / "checkpoints" / "step00000006" / "mp_rank_00_model_states.pt", weights_only=True
    )
    assert state["data"] == {"epoch": 0, "index": 6, "served": 6}
    assert state["mlflow_run_id"] == run_id
    assert not torch.equal(first["embed.weight"], state["module"]["embed.weight"])


def test_resume_without_checkpoint_is_a_clear_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TibnlpError, match="no complete checkpoint"):
        h.main(tmp_path / "run", {"resume": True})


class _Payload:
    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (print, ("unpickled!",))


@pytest.mark.parametrize("zero_stage", [0, 2])
def test_loading_refuses_arbitrary_pickles(tmp_path, zero_stage: int) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "run"
    h.main(out, {"max_steps": 2, "checkpoint_every": 2, "zero_stage": zero_stage})
    # ZeRO's optimizer files hold a few DeepSpeed classes: they load under the allowlist.
    h.main(out, {"max_steps": 3, "checkpoint_every": 2, "zero_stage": zero_stage, "resume": True})
    target = out / "checkpoints" / "step00000003" / "mp_rank_00_model_states.pt"
    state = torch.load(target, weights_only=True)
    state["evil"] = _Payload()
    with open(target, "wb") as fh:
        torch.save(state, fh, pickle_module=pickle)
    with pytest.raises(TibnlpError, match="could not be loaded safely"):
        h.main(out, {"max_steps": 4, "zero_stage": zero_stage, "resume": True})
