"""The one loop's fine-tuning hooks: an evaluator callback, keep-best selection with the best
weights restored at the end, and early stopping; checkpoints off (checkpoint_every=0)."""

from __future__ import annotations

from pathlib import Path

import engine_harness as h
import pytest
import torch

from tibnlp.config import EngineConfig, OptimizerConfig
from tibnlp.training.engine import init_distributed
from tibnlp.training.loop import LoopSettings, TrainLoop
from tibnlp.training.wiring import start_training


def _loop(scores: list[float], patience: int, snapshots: list[dict], tmp: Path) -> TrainLoop:
    engine_cfg = EngineConfig(threads=1)
    world = init_distributed(engine_cfg)
    torch.manual_seed(0)
    model = h.TinyPretrainer()
    steps = len(scores)
    training = start_training(model, engine_cfg, OptimizerConfig(lr=1e-2), 8, 0, steps, world)
    ids, lengths = h.examples(0)
    train = training.batches(h.make_plan(8, 0), h.make_collate(ids, lengths, 0), 8)

    def evaluate() -> dict[str, float]:
        assert not model.training  # the loop evaluates in eval mode...
        snapshots.append({k: v.clone() for k, v in model.state_dict().items()})
        return {"score": scores[len(snapshots) - 1], "other": 1.0}

    settings = LoopSettings(
        max_steps=steps,
        log_every=1,
        eval_every=1,
        eval_batches=0,
        checkpoint_every=0,
        keep_checkpoints=0,
        checkpoint_dir=tmp / "never",
        progress=False,
        select="score",
        patience=patience,
    )
    return training.loop(train, None, settings, evaluate)


def test_early_stopping_restores_the_best_weights(tmp_path) -> None:  # type: ignore[no-untyped-def]
    snapshots: list[dict] = []
    loop = _loop([0.2, 0.5, 0.4, 0.3, 0.9, 0.1], 2, snapshots, tmp_path)
    result = loop.run()
    assert result.stopped_by == "early_stopping" and result.step == 4  # 0.4, 0.3: no gain
    assert result.best_step == 2 and result.best == {"score": 0.5, "other": 1.0}
    assert result.eval == {"eval/score": 0.3, "eval/other": 1.0}  # the last evaluation
    restored = loop.engine.module.state_dict()
    assert all(torch.equal(restored[k], v) for k, v in snapshots[1].items())
    assert not all(torch.equal(restored[k], v) for k, v in snapshots[3].items())
    assert loop.engine.module.training  # ...and trains in train mode
    assert not (tmp_path / "never").exists()  # checkpoint_every=0: nothing written


def test_without_patience_every_step_runs_and_the_best_is_kept(tmp_path) -> None:  # type: ignore[no-untyped-def]
    snapshots: list[dict] = []
    loop = _loop([0.2, 0.5, 0.4, 0.3, 0.9, 0.1], 0, snapshots, tmp_path)
    result = loop.run()
    assert result.stopped_by == "max_steps" and result.step == 6 and result.best_step == 5
    restored = loop.engine.module.state_dict()
    assert all(torch.equal(restored[k], v) for k, v in snapshots[4].items())


def test_select_names_a_metric_the_evaluation_gives(tmp_path) -> None:  # type: ignore[no-untyped-def]
    loop = _loop([0.1, 0.2], 0, [], tmp_path)
    loop.settings.select = "macro_f1"
    with pytest.raises(TypeError, match="select='macro_f1'"):
        loop.run()
