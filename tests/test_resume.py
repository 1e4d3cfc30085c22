"""Kill a training process with SIGKILL after a checkpoint, resume it, and compare with an
uninterrupted run: on CPU with fixed seeds and one thread the result is bit-identical."""

from __future__ import annotations

import json
from pathlib import Path

import engine_harness as h
import pytest
import torch
from mlflow.tracking import MlflowClient

CONFIG = {"max_steps": 8, "checkpoint_every": 2, "eval_every": 3, "seed": 11}


@pytest.mark.slow
def test_sigkill_then_resume_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    killed = tmp_path / "killed"
    h.run_until_killed(killed, {**CONFIG, "sleep_after_step": 1.0}, "step00000004")

    h.main(killed, {**CONFIG, "resume": True})
    h.main(tmp_path / "straight", CONFIG)

    resumed = json.loads((killed / "result.json").read_text())
    straight = json.loads((tmp_path / "straight" / "result.json").read_text())
    a = torch.load(killed / "weights.pt", weights_only=True)
    b = torch.load(tmp_path / "straight" / "weights.pt", weights_only=True)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    resumed["train"].pop("tokens_per_s")
    straight["train"].pop("tokens_per_s")
    assert resumed["train"] == straight["train"]
    assert resumed["eval"] == straight["eval"]

    # The resumed process continued the killed process's MLflow run.
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = {
        r.info.run_id
        for r in client.search_runs([client.get_experiment_by_name("engine-tests").experiment_id])
    }
    assert len(runs) == 2  # killed+resumed, straight
    history = client.get_metric_history(resumed["run_id"], "train/loss")
    assert max(m.step for m in history) == 8
    last = {m.step: m.value for m in history}[8]
    assert last == straight["train"]["train/loss"]
    assert client.get_run(resumed["run_id"]).info.status == "FINISHED"
