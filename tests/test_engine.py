"""Engine pieces: budgets, lr schedules, LAMB, the DeepSpeed config, sharded batches, the loop."""

from __future__ import annotations

import itertools
import math

import engine_harness as h
import pytest
import torch

from tibnlp.config import EngineConfig, OptimizerConfig, load_config
from tibnlp.errors import ConfigError
from tibnlp.training.batches import ShardedBatches
from tibnlp.training.engine import accumulation_steps, deepspeed_config, resolve_precision
from tibnlp.training.optim import Lamb, build_optimizer
from tibnlp.training.schedule import build_scheduler, lr_factor, parse_duration
from tibnlp.training.step import TrainingDiverged


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("2h", 7200), ("30m", 1800), ("90s", 90), ("1h30m", 5400), ("45", 45), ("0.5h", 1800)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["2x", "h", "1h 2", "-3m", "0s", "m30"])
def test_parse_duration_rejects(bad: str) -> None:
    with pytest.raises(ConfigError):
        parse_duration(bad)


def test_time_budget_validated_at_config_load() -> None:
    assert parse_duration("") is None
    with pytest.raises(ConfigError, match=r"pretrain\.time_budget"):
        load_config(None, ["pretrain.time_budget=2 hours"])


def test_warmup_then_linear_decay() -> None:
    f = [lr_factor(s, warmup=4, total=12, kind="linear") for s in range(13)]
    assert f[:4] == [0.25, 0.5, 0.75, 1.0]
    assert f[4] == 1.0 and f[8] == pytest.approx(0.5) and f[12] == 0.0
    assert all(a >= b for a, b in itertools.pairwise(f[3:]))


def test_cosine_decay_and_floor() -> None:
    f = [lr_factor(s, 0, 10, "cosine", min_ratio=0.1) for s in range(11)]
    assert f[0] == pytest.approx(1.0) and f[5] == pytest.approx(0.55) and f[10] == 0.1
    assert lr_factor(50, 0, 10, "cosine", 0.1) == 0.1  # past the end: stays at the floor
    assert lr_factor(7, 2, 10, "constant") == 1.0


def test_scheduler_drives_the_optimizer() -> None:
    p = torch.nn.Parameter(torch.zeros(2))
    cfg = OptimizerConfig(lr=0.1, warmup_steps=2, schedule="linear")
    opt = torch.optim.SGD([p], lr=cfg.lr)
    sched = build_scheduler(opt, cfg, total_steps=4)
    seen = []
    for _ in range(4):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([0.05, 0.1, 0.1, 0.05])
    assert sched.state_dict()["last_epoch"] == 4
    # Resuming with a longer run follows the new schedule from the saved position.
    longer = build_scheduler(opt, cfg, total_steps=8)
    longer.load_state_dict(sched.state_dict())
    assert longer.last_epoch == 4 and longer.lr_lambdas[0].total == 8


def test_lamb_step_matches_the_formula() -> None:
    w0 = torch.tensor([3.0, 4.0])  # ||w|| = 5
    p = torch.nn.Parameter(w0.clone())
    p.grad = torch.tensor([1.0, -2.0])
    Lamb([p], lr=0.1, betas=(0.9, 0.999), eps=0.0, weight_decay=0.0).step()
    update = torch.tensor([1.0, -1.0])  # first bias-corrected Adam step: sign(grad)
    expected = w0 - 0.1 * (5.0 / math.sqrt(2.0)) * update
    assert torch.allclose(p.detach(), expected, atol=1e-6)


def test_lamb_zero_weights_use_trust_one_and_decay_applies() -> None:
    p = torch.nn.Parameter(torch.zeros(3))
    p.grad = torch.ones(3)
    Lamb([p], lr=0.5, eps=0.0).step()
    assert torch.allclose(p.detach(), torch.full((3,), -0.5))
    q = torch.nn.Parameter(torch.ones(2))
    q.grad = torch.zeros(2)  # only weight decay moves it: towards zero
    Lamb([q], lr=0.1, weight_decay=0.1).step()
    assert (q.detach() < 1).all()


def test_lamb_minimises_a_quadratic() -> None:
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(8, 8))
    opt = Lamb([w], lr=0.02)
    start = float(((w.detach() - 1.0) ** 2).sum())
    for _ in range(300):
        opt.zero_grad()
        loss = ((w - 1.0) ** 2).sum()
        loss.backward()
        opt.step()
    # A fixed lr leaves a small oscillation of size lr * ||w||; the loss still falls 1000-fold.
    assert float(((w.detach() - 1.0) ** 2).sum()) < start / 1000


def test_no_weight_decay_on_biases_and_norms() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    opt = build_optimizer(model, OptimizerConfig(name="adamw", weight_decay=0.1))
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and len(decay["params"]) == 1
    assert no_decay["weight_decay"] == 0.0 and len(no_decay["params"]) == 3
    assert isinstance(build_optimizer(model, OptimizerConfig(name="lamb")), Lamb)


def test_deepspeed_config_from_ours() -> None:
    ds = deepspeed_config(EngineConfig(zero_stage=2), OptimizerConfig(grad_clip=0.5), 32, 4, 2)
    assert ds["train_batch_size"] == 32
    assert ds["train_micro_batch_size_per_gpu"] == 4
    assert ds["gradient_accumulation_steps"] == 4
    assert ds["gradient_clipping"] == 0.5 and ds["zero_optimization"] == {"stage": 2}
    if not torch.cuda.is_available():
        assert "bf16" not in ds and "fp16" not in ds  # fp32 on CPU
    assert accumulation_steps(32, 0, 2) == 1
    with pytest.raises(ConfigError, match="batch_size"):
        accumulation_steps(30, 4, 2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU behaviour")
def test_precision_on_cpu() -> None:
    assert resolve_precision("auto") == "fp32"
    with pytest.raises(ConfigError, match=r"engine\.precision"):
        resolve_precision("fp16")  # bf16 on CPU: tests/test_precision_cpu.py


def _sources(world: int, accum: int) -> list[ShardedBatches]:
    ids, lengths = h.examples(1)
    collate = h.make_collate(ids, lengths, 1)
    return [ShardedBatches(h.make_plan(8, 1), collate, 8, r, world, accum) for r in range(world)]


def test_ranks_split_each_global_batch_without_overlap() -> None:
    plan = h.make_plan(8, 1)(0)
    ranks = _sources(2, 2)
    one = _sources(1, 4)[0]
    for b in range(3):
        parts = [mb for src in ranks for mb in src.next()]
        single = one.next()
        masked = torch.cat([p["input_ids"] for p in parts])
        labels = torch.cat([p["mlm_labels"] for p in parts])
        rows = torch.where(labels != -100, labels, masked)  # undo the masking
        assert rows.shape[0] == 8
        ids, _ = h.examples(1)
        assert sorted(rows[:, 0].tolist()) == sorted(ids[plan[b], 0].tolist())
        # Same micro-batch keys -> identical masks whatever the process layout.
        for a, c in zip(parts, single, strict=True):
            assert torch.equal(a["mlm_labels"], c["mlm_labels"])


def test_position_resumes_without_replay_and_wraps_epochs() -> None:
    src = _sources(1, 1)[0]
    n = len(src)
    for _ in range(n + 1):  # one full epoch and one batch into the next
        src.next()
    state = src.state_dict()
    assert state == {"epoch": 1, "index": 1, "served": n + 1}
    fresh = _sources(1, 1)[0]
    fresh.load_state_dict(state)
    assert torch.equal(src.next()[0]["input_ids"], fresh.next()[0]["input_ids"])


def test_loop_learns_and_logs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    h.main(tmp_path / "run", {"max_steps": 30, "lr": 3e-2, "checkpoint_every": 30})
    import json

    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["step"] == 30
    # Starts near ln(50) + ln(2) = 4.6; both tasks are learnable from context.
    assert result["train"]["train/loss"] < 3.5
    assert result["eval"]["eval/mask_accuracy"] > 0.25  # chance: 1/45
    assert result["eval"]["eval/sop_accuracy"] > 0.8
    assert set(result["eval"]) == {
        "eval/loss",
        "eval/mask_loss",
        "eval/mask_accuracy",
        "eval/sop_loss",
        "eval/sop_accuracy",
    }
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    history = client.get_metric_history(result["run_id"], "train/loss")
    assert len(history) == 30
    assert client.get_metric_history(result["run_id"], "eval/loss")[-1].step == 30
    assert client.get_run(result["run_id"]).info.status == "FINISHED"


def test_nan_loss_stops_with_the_step_and_keeps_the_checkpoint(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tibnlp.training import checkpoint

    with pytest.raises(TrainingDiverged, match="at step 5"):
        h.main(tmp_path / "run", {"max_steps": 8, "checkpoint_every": 2, "nan_at": 5})
    ckpt = tmp_path / "run" / "checkpoints"
    assert checkpoint.latest_tag(ckpt) == "step00000004"
    assert not (ckpt / "step00000005").exists()
    # The run can resume from there once the cause is fixed.
    h.main(tmp_path / "run", {"max_steps": 8, "checkpoint_every": 2, "resume": True})
    assert checkpoint.latest_tag(ckpt) == "step00000008"


def test_time_budget_stops_early_and_checkpoints(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from tibnlp.training import checkpoint

    # The budget is checked before each step: a spent budget lets one step run, then stops.
    h.main(tmp_path / "run", {"max_steps": 50, "checkpoint_every": 20, "time_budget_s": 1e-9})
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["step"] == 1 and result["stopped_by"] == "time_budget"
    assert checkpoint.latest_tag(tmp_path / "run" / "checkpoints") == "step00000001"
    assert "eval/loss" in result["eval"]  # the final step is evaluated too


def _max_rel(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k].double() - b[k].double()).norm() / b[k].double().norm()) for k in b)


def test_accumulation_averages_the_micro_batches_mean_losses(tmp_path) -> None:
    """micro_batch_size is a speed knob: 2 x 4 gives the update of one batch of 8 when each
    micro-batch holds as many MLM targets (the loss is a mean over a micro-batch's targets);
    with random masks it is the mean of the two means, not the batch's mean, and differs."""
    base = {"max_steps": 4, "precision": "fp32", "dropout": 0.0}
    for fixed in (True, False):
        h.main(tmp_path / f"one-{fixed}", {**base, "fixed_masks": fixed, "micro_batch_size": 0})
        h.main(tmp_path / f"two-{fixed}", {**base, "fixed_masks": fixed, "micro_batch_size": 4})
    w = {p.parent.name: torch.load(p, weights_only=True) for p in tmp_path.glob("*/weights.pt")}
    assert _max_rel(w["two-True"], w["one-True"]) <= 1e-6
    assert _max_rel(w["two-False"], w["one-False"]) > 1e-3


def test_zero0_clipping_is_deepspeeds_to_the_bit(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """At ZeRO 0 the engine clips with `fused_clip` (foreach ops) instead of DeepSpeed's loop
    over parameters: on the CPU the weights are DeepSpeed's exactly, with clipping active
    (a small grad_clip) and off (a large one)."""
    from deepspeed.runtime.engine import DeepSpeedEngine

    from tibnlp.training import engine

    assert callable(getattr(DeepSpeedEngine, "clip_fp32_gradients", None))  # what we replace
    calls: list[float] = []
    fused = engine.fused_clip

    def counted(params, max_norm, world_size):  # type: ignore[no-untyped-def]
        calls.append(max_norm)
        fused(params, max_norm, world_size)

    base = {"max_steps": 4, "precision": "fp32", "lr": 3e-2}
    for clip in (0.05, 100.0):
        with monkeypatch.context() as m:
            m.setattr(engine, "fused_clip", counted)
            h.main(tmp_path / f"fused-{clip}", {**base, "grad_clip": clip})
        with monkeypatch.context() as m:  # DeepSpeed's own clip_fp32_gradients left in place
            m.setattr(engine, "use_fused_clip", lambda ds_engine, world_size: None)
            h.main(tmp_path / f"deepspeed-{clip}", {**base, "grad_clip": clip})
    assert calls == [0.05] * 4 + [100.0] * 4
    w = {p.parent.name: torch.load(p, weights_only=True) for p in tmp_path.glob("*/weights.pt")}
    for clip in (0.05, 100.0):
        a, b = w[f"fused-{clip}"], w[f"deepspeed-{clip}"]
        assert all(torch.equal(a[k], b[k]) for k in b)
    assert _max_rel(w["fused-0.05"], w["fused-100.0"]) > 1e-3  # clipping was active


def test_one_process_skips_the_allreduce_with_the_same_weights(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """At ZeRO 0 in a world of one the gradient all-reduce is left out: it averaged over one
    process, so the weights are those of the engine that runs it, to the bit."""
    from deepspeed.runtime.engine import DeepSpeedEngine

    from tibnlp.training import engine

    reduced: list[int] = []
    real = DeepSpeedEngine.allreduce_gradients

    def counted(self, *a, **k):  # type: ignore[no-untyped-def]
        reduced.append(1)
        return real(self, *a, **k)

    monkeypatch.setattr(DeepSpeedEngine, "allreduce_gradients", counted)
    base = {"max_steps": 4, "precision": "fp32", "lr": 3e-2, "grad_clip": 0.05}
    h.main(tmp_path / "skipped", base)
    assert reduced == []
    with monkeypatch.context() as m:
        m.setattr(engine, "skip_lone_allreduce", lambda ds_engine: None)
        h.main(tmp_path / "reduced", base)
    assert len(reduced) == 4
    a, b = (
        torch.load(tmp_path / n / "weights.pt", weights_only=True) for n in ("skipped", "reduced")
    )
    assert all(torch.equal(a[k], b[k]) for k in b)


def test_a_local_world_is_left_at_exit() -> None:
    """The local world of one stays up for a process's later stages and is destroyed at exit
    (NCCL warns of a leak otherwise); a child process shows both."""
    import subprocess
    import sys

    code = (
        "import atexit, torch.distributed as dist\n"
        "from tibnlp.config import EngineConfig\n"
        "from tibnlp.training.engine import init_distributed\n"
        "init_distributed(EngineConfig(threads=1)); init_distributed(EngineConfig(threads=1))\n"
        "print(dist.is_initialized()); atexit._run_exitfuncs(); print(dist.is_initialized())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert done.stdout.split()[-2:] == ["True", "False"], done.stdout + done.stderr


def test_logged_lr_is_the_optimizers_own_not_param_group_0s(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Groups are built only where they have parameters: with every parameter under a rate of
    its own (finetune.layer_decay with head_lr, post-norm), group 0 is the embedding's, the
    lowest rate, and `lr` logged it. `lr` is optimizer.lr as the schedule sets it (the top
    layer's rate under layer decay)."""
    from tibnlp.training.engine import init_distributed
    from tibnlp.training.wiring import start_training

    world = init_distributed(EngineConfig(threads=1))
    optim = OptimizerConfig(lr=5e-3, warmup_steps=2, schedule="linear")
    rates = {"embed.": 1e-4, "conv.": 5e-3, "mlm.": 2e-2, "sop.": 2e-2}
    training = start_training(
        h.TinyPretrainer(), EngineConfig(threads=1), optim, 8, 0, 4, world, rates
    )
    assert training.engine.get_lr()[0] == pytest.approx(1e-4 * lr_factor(0, 2, 4))  # group 0
    logged: list[float] = []
    loop = h.tiny_loop(training, tmp_path / "ck", max_steps=4, log_every=1)
    loop.run(on_log=lambda step, train: logged.append(train["lr"]))
    assert logged == pytest.approx([5e-3 * lr_factor(s, 2, 4) for s in range(4)])
