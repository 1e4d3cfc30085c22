"""The resume path: RNG per rank, the schedule, the budget clock, fixed held-out scores."""

from __future__ import annotations

from pathlib import Path

import engine_harness as h
import pytest
import torch

from tibnlp.config import EngineConfig, OptimizerConfig
from tibnlp.training.engine import init_distributed
from tibnlp.training.loop import TrainLoop
from tibnlp.training.schedule import lr_factor
from tibnlp.training.wiring import start_training

LR, WARMUP = 1e-2, 2


def _loop(tmp: Path, max_steps: int) -> TrainLoop:
    world = init_distributed(EngineConfig(threads=1))
    torch.manual_seed(0)
    cfg = OptimizerConfig(lr=LR, warmup_steps=WARMUP, schedule="linear")
    training = start_training(
        h.TinyPretrainer(), EngineConfig(threads=1), cfg, 8, 0, max_steps, world
    )
    # checkpoint_every=1000: only the final save
    return h.tiny_loop(
        training, tmp / "ck", max_steps=max_steps, checkpoint_every=1000, keep_checkpoints=2
    )


def test_resuming_with_more_steps_follows_the_new_schedule_from_the_first_update(
    tmp_path: Path,
) -> None:
    # WarmupDecay's promise: "resuming with a new max_steps (to train longer) follows the new
    # schedule from the saved step". The first update after the resume must use it too.
    _loop(tmp_path, 4).run()  # ends (and checkpoints) at step 4, at the old schedule's end
    longer = _loop(tmp_path, 8)
    assert longer.restore() and longer.step == 4
    lrs: list[float] = []
    real_step = longer.train_step

    def step(over: bool):  # type: ignore[no-untyped-def]
        lrs.append(longer.engine.optimizer.param_groups[0]["lr"])
        return real_step(over)

    longer.train_step = step  # type: ignore[method-assign]
    longer.run()
    expected = [LR * lr_factor(s, WARMUP, 8) for s in range(4, 8)]
    assert lrs == pytest.approx(expected)  # before the fix: lrs[0] == 0.0 (old schedule)


@pytest.mark.slow
def test_each_rank_resumes_its_own_rng_stream(tmp_path: Path) -> None:
    # DeepSpeed writes `client_state` from data-parallel rank 0 only, so a checkpoint held rank
    # 0's RNG states and every rank restored them: per-rank dropout streams became identical.
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(h.__file__).parent.parent), *sys.path])
    script = Path(h.__file__).parent / "rank_rng_script.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    cmd += ["--master_port", str(port), str(script), str(tmp_path)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    import json

    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["expected"] != ranks[1]["expected"]  # the streams differ per rank
    for r in ranks:
        assert r["got"] == r["expected"]  # before the fix: rank 1 got rank 0's stream


def test_held_out_scores_are_the_same_at_every_evaluation(tmp_path: Path) -> None:
    # `evaluate` promises fixed held-out inputs, but ELECTRA's generator samples its
    # replacements from the global RNG in eval mode too: the same weights scored twice gave
    # two different eval/rtd_loss (and an --eval-only score unlike the run's last one).
    from design_models import tiny

    from tibnlp.config.model import HeadsConfig
    from tibnlp.models.electra import ElectraForPretraining

    cfg = tiny(vocab_size=60, embedding_size=16, ffn_size=64, heads=HeadsConfig(4, 4, 0))
    world = init_distributed(EngineConfig(threads=1))
    torch.manual_seed(0)
    model = ElectraForPretraining(cfg)
    training = start_training(model, EngineConfig(threads=1), OptimizerConfig(), 4, 0, 8, world)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, cfg.vocab_size, (4, 12), generator=g)
    labels = torch.full_like(ids, -100)
    labels[:, [2, 5, 6]] = ids[:, [2, 5, 6]]
    batch = {
        "input_ids": ids.masked_fill(labels != -100, 4),
        "attention_mask": torch.ones_like(ids),
        "token_type_ids": torch.zeros_like(ids),
        "mlm_labels": labels,
    }
    heldout = training.batches(lambda epoch: [[0, 1, 2, 3]], lambda idx, key: batch, 4)
    settings = h.quiet_settings(tmp_path / "ck", log_every=1, eval_every=1, eval_batches=1)
    loop = training.loop(heldout, heldout, settings)
    first, second = loop.evaluate(), loop.evaluate()
    assert first["rtd_loss"] == second["rtd_loss"] and first == second


def test_first_throughput_after_a_resume_counts_only_the_resumed_steps(
    tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    # The checkpointed log window carries "_tokens" of steps trained before the kill, while
    # the rate's clock restarts at the resume: tokens_per_s came out inflated.
    from tibnlp.training import loop as loop_module

    now = [0.0]

    class FakeTime:  # one second per training step
        @staticmethod
        def monotonic() -> float:
            return now[0]

    monkeypatch.setattr(loop_module, "time", FakeTime)

    class Killed(Exception):
        pass

    def make(kill_at: int = 0) -> TrainLoop:
        loop = _loop(tmp_path, 4)
        loop.settings.log_every, loop.settings.checkpoint_every = 4, 2
        real_step = loop.train_step

        def step(over: bool):  # type: ignore[no-untyped-def]
            if loop.step + 1 == kill_at:
                raise Killed
            now[0] += 1.0
            return real_step(over)

        loop.train_step = step  # type: ignore[method-assign]
        return loop

    with pytest.raises(Killed):
        make(kill_at=3).run()  # killed after the checkpoint at step 2, mid log window
    resumed = make()
    assert resumed.restore()
    before = resumed.tokens
    logged: list[dict[str, float]] = []
    resumed.run(on_log=lambda step, train: logged.append(train))
    assert len(logged) == 1  # step 4
    assert logged[0]["tokens_per_s"] == pytest.approx((resumed.tokens - before) / 2.0)


def test_resumed_budget_counts_the_checkpoint_steps_evaluation(tmp_path: Path) -> None:
    # The checkpoint stored train_seconds as read before that step's evaluation (and the
    # clock restarts at the resume), so every resume dropped one evaluation's time from the
    # time budget: a resumed run trained longer than its uninterrupted twin.
    now = [0.0]

    class Killed(Exception):
        pass

    def make(out: Path, kill_at: int = 0) -> TrainLoop:
        loop = _loop(out, 4)
        s = loop.settings
        s.clock, s.eval_every, s.checkpoint_every = (lambda: now[0]), 2, 2
        real_step, real_eval = loop.train_step, loop.evaluate

        def step(over: bool):  # type: ignore[no-untyped-def]
            if loop.step + 1 == kill_at:
                raise Killed
            now[0] += 1.0  # a step takes 1 s
            return real_step(over)

        def evaluate():  # type: ignore[no-untyped-def]
            now[0] += 10.0  # an evaluation 10 s
            return real_eval()

        loop.train_step, loop.evaluate = step, evaluate  # type: ignore[method-assign]
        return loop

    straight = make(tmp_path / "straight")
    straight.run()

    with pytest.raises(Killed):
        make(tmp_path / "killed", kill_at=3).run()
    resumed = make(tmp_path / "killed")
    assert resumed.restore() and resumed.step == 2
    assert resumed.train_seconds == pytest.approx(2 + 10)  # step 2's evaluation was spent
    resumed.run()
    assert resumed.train_seconds == pytest.approx(straight.train_seconds)


def test_objects_beside_the_loop_ride_in_its_checkpoint(tmp_path: Path) -> None:
    # `TrainLoop.extra_state` (pretraining's LearningCheck: warned or probed already); a
    # checkpoint written before an object was added leaves that object as it started
    from tibnlp.training.learning_check import LearningCheck

    def check() -> LearningCheck:
        return LearningCheck(0.1, 0.25, lambda at: 0.0)

    loop, first = _loop(tmp_path, 4), check()
    first.warned = first.probed = True
    loop.extra_state["learning_check"] = first
    loop.run()  # checkpoints at step 4

    resumed, again = _loop(tmp_path, 8), check()
    resumed.extra_state["learning_check"] = again
    assert resumed.restore() and again.warned and again.probed

    older, fresh = _loop(tmp_path, 8), check()
    older.extra_state["not_saved"] = fresh
    assert older.restore() and not fresh.warned and not fresh.probed
