"""`engine.precision: bf16` on CPU: autocast through DeepSpeed with fp32 weights and optimizer,
a real pretraining run that learns and resumes bit-identically, and the error on a CPU
without native bf16."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from design_models import tiny
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file
from test_pretrain import TINY, inputs  # noqa: F401  (module fixture: corpus + vocabulary)

from tibnlp.config import EngineConfig, OptimizerConfig, load_config
from tibnlp.errors import ConfigError
from tibnlp.models.pretraining import AlbertForPretraining
from tibnlp.training import engine as engine_mod

needs_bf16 = pytest.mark.skipif(
    torch.cuda.is_available() or not engine_mod.cpu_has_bf16(),
    reason="CPU bf16 path: needs a CPU with native bf16 (AVX512-BF16/AMX-BF16) and no GPU",
)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU behaviour")
def test_bf16_on_a_cpu_without_it_names_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_mod, "cpu_has_bf16", lambda: False)
    with pytest.raises(ConfigError, match=r"engine\.precision.*bf16") as err:
        engine_mod.resolve_precision("bf16")
    assert "auto" in (err.value.hint or "")
    with pytest.raises(ConfigError, match=r"engine\.precision"):
        engine_mod.deepspeed_config(EngineConfig(precision="bf16"), OptimizerConfig(), 8, 0, 1)
    assert engine_mod.resolve_precision("auto") == "fp32"


@needs_bf16
def test_bf16_cpu_config_is_deepspeed_autocast_with_fp32_comms() -> None:
    ds = engine_mod.deepspeed_config(EngineConfig(precision="bf16"), OptimizerConfig(), 8, 0, 1)
    assert "bf16" not in ds and "fp16" not in ds  # weights and optimizer stay fp32
    assert ds["torch_autocast"] == {
        "enabled": True,
        "dtype": "bfloat16",
        "lower_precision_safe_modules": [],
    }
    assert engine_mod.resolve_precision("auto") == "fp32"


def test_bf16_on_a_gpu_is_the_same_autocast(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not DeepSpeed's bf16 mode: that one kept bf16 weights (exports lost the fp32 masters)
    and ran a per-parameter overflow check every step (benchmarks/results/precision_ops.md)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    ds = engine_mod.deepspeed_config(EngineConfig(precision="bf16"), OptimizerConfig(), 8, 0, 1)
    assert "bf16" not in ds and ds["torch_autocast"]["dtype"] == "bfloat16"
    assert "fp16" in engine_mod.deepspeed_config(
        EngineConfig(precision="fp16"), OptimizerConfig(), 8, 0, 1
    )


@needs_bf16
def test_bf16_engine_runs_matmuls_in_bf16_and_keeps_fp32_state() -> None:
    world = engine_mod.init_distributed(EngineConfig(threads=1))
    torch.manual_seed(0)
    model = AlbertForPretraining(tiny(vocab_size=60, dropout=0.1))
    engine = engine_mod.initialize(
        model, EngineConfig(precision="bf16"), OptimizerConfig(warmup_steps=0), 4, 0, 10, world
    )
    seen: list[torch.dtype] = []
    model.encoder.layer.ffn_in.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    ids = torch.randint(5, 60, (4, 16))
    labels = torch.full_like(ids, -100)
    labels[:, 3] = ids[:, 3]
    batch = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "token_type_ids": torch.zeros_like(ids),
        "mlm_labels": labels,
        "sop_labels": torch.tensor([0, 1, 0, 1]),
    }
    out = engine(**batch)
    assert out["loss"].dtype == torch.float32  # the losses are computed in fp32
    engine.backward(out["loss"])
    engine.step()
    engine.eval()
    with torch.no_grad():
        engine(**batch)
    assert seen == [torch.bfloat16] * 4  # 2 layers, train and eval
    assert all(p.dtype == torch.float32 for p in model.parameters())
    state = engine.optimizer.state[next(iter(model.parameters()))]
    assert state["exp_avg"].dtype == torch.float32


def _config(inputs: Path, out: Path, **pretrain: object) -> Path:  # noqa: F811
    data = {k: dict(v) for k, v in TINY.items()}
    data["pretrain"].update(
        corpus=str(inputs / "corpus"),
        vocab=str(inputs / "vocab"),
        output=str(out),
        checkpoint_every=4,
        eval_every=4,
        log_every=1,
        optimizer={"lr": 3e-3, "warmup_steps": 0, "schedule": "constant"},
        **pretrain,
    )
    data["engine"] = {"threads": 1, "precision": "bf16"}
    data["tracking"] = {"uri": f"sqlite:///{out.parent / 'mlflow.db'}", "experiment": "bf16"}
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@needs_bf16
def test_bf16_pretraining_learns_and_resumes_exactly(inputs: Path, tmp_path: Path) -> None:  # noqa: F811
    from tibnlp.training.pretrain import run_pretraining

    straight = tmp_path / "straight"
    run_pretraining(load_config(_config(inputs, straight, max_steps=12)))
    parted = tmp_path / "parted"
    run_pretraining(load_config(_config(inputs, parted, max_steps=8)))
    run_pretraining(load_config(_config(inputs, parted, max_steps=12)), resume=True)

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    by_name = {
        r.info.run_name: r
        for r in client.search_runs([client.get_experiment_by_name("bf16").experiment_id])
    }
    history = client.get_metric_history(by_name["straight"].info.run_id, "train/mask_loss")
    losses = [m.value for m in sorted(history, key=lambda m: m.step)]
    assert len(losses) == 12
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.1, losses  # it learns
    a = load_file(straight / "model" / "model.safetensors")
    b = load_file(parted / "model" / "model.safetensors")
    assert all(t.dtype == torch.float32 for t in a.values())  # fp32 master weights saved
    for key in a:
        assert torch.equal(a[key], b[key]), key  # resume is exact in bf16 autocast too
    assert (
        by_name["straight"].data.metrics["eval/loss"] == by_name["parted"].data.metrics["eval/loss"]
    )


@needs_bf16
def test_dense_attention_under_cpu_autocast_runs_in_fp32_and_returns_bf16() -> None:
    from tibnlp.models.attention import AttentionContext, DenseCore

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 6, 8, generator=g).bfloat16().requires_grad_() for _ in range(3))
    mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    ctx = AttentionContext(mask, mask.sum(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = DenseCore(4)(q, k, v, ctx)
    assert out.dtype == torch.bfloat16
    expected = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=mask[:, None, None, :]
    )
    torch.testing.assert_close(out.float(), expected.bfloat16().float())
    out.float().sum().backward()
    assert q.grad is not None and q.grad.dtype == torch.bfloat16
