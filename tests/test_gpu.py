"""CUDA correctness of the models (`pytest -m gpu`; skipped where there is no CUDA device).

Tolerances (norm-relative error ||cuda - cpu|| / ||cpu||, per tensor, TF32 off):
- 1e-4 for the loss and every parameter gradient in fp32: both sides compute in fp32 and
  differ only in reduction order (measured fp32 gaps sit far under 1e-5);
- 2e-3 where multi-scale runs FlexAttention on CUDA: Triton's fp32 dot may use TF32
  (about 3e-4 relative on a product), which torch's TF32 switch does not govern;
- bf16 autocast: finite loss and gradients, loss within 5% of fp32 (bf16 operands round at
  about 4e-3 relative; the loss averages many of them).
"""

from __future__ import annotations

import copy

import pytest
import torch

from benchmarks.gpu.designs import Design, batch, build, designs
from tests.test_long_documents import MEMORY, _cfg, env  # noqa: F401  (env: the fixture, reused)

pytestmark = pytest.mark.gpu

LENGTHS = [40, 33, 17, 9]  # padded rows; long enough for N/4 windows wider than 3


@pytest.fixture(autouse=True)
def _no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def _loss_and_grads(model, inputs, autocast: bool = False):  # type: ignore[no-untyped-def]
    model.zero_grad(set_to_none=True)
    device = next(model.parameters()).device.type
    with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
        out = model(**inputs)
    out["loss"].backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return out["loss"].detach(), grads


@pytest.mark.parametrize("design", designs(), ids=lambda d: d.name)
def test_design_on_cuda_equals_cpu_in_fp32(design: Design) -> None:
    cpu = build(design)
    cuda = copy.deepcopy(cpu).cuda()
    loss_cpu, g_cpu = _loss_and_grads(cpu, batch(design, LENGTHS))
    loss_gpu, g_gpu = _loss_and_grads(cuda, batch(design, LENGTHS, device="cuda"))
    tol = 2e-3 if design.cfg.scales.enabled else 1e-4
    assert _rel(loss_gpu, loss_cpu) <= tol
    assert g_gpu.keys() == g_cpu.keys()
    for name in g_cpu:
        assert _rel(g_gpu[name], g_cpu[name]) <= tol, name


@pytest.mark.parametrize("design", designs(), ids=lambda d: d.name)
def test_design_runs_under_bf16_autocast(design: Design) -> None:
    model = build(design).cuda()
    inputs = batch(design, LENGTHS, device="cuda")
    loss32, _ = _loss_and_grads(model, inputs)
    loss16, grads = _loss_and_grads(model, inputs, autocast=True)
    assert torch.isfinite(loss16)
    assert all(torch.isfinite(g).all() for g in grads.values())
    assert _rel(loss16, loss32) <= 0.05


def test_multiscale_takes_flex_attention_on_cuda_and_matches_the_cpu_path() -> None:
    from tibnlp.models.attention.multiscale import MultiScaleCore

    design = next(d for d in designs() if d.name == "multi-scale")
    model = build(design).cuda().eval()
    inputs = batch(design, LENGTHS, device="cuda")
    calls = []
    original = MultiScaleCore._flex

    def spy(self, *args):  # type: ignore[no-untyped-def]
        calls.append(1)
        return original(self, *args)

    MultiScaleCore._flex = spy  # type: ignore[method-assign]
    try:
        with torch.no_grad():
            got = model(**inputs)["loss"]
    finally:
        MultiScaleCore._flex = original  # type: ignore[method-assign]
    assert calls, "multi-scale did not take the FlexAttention path on CUDA"
    with torch.no_grad():
        want = build(design).eval()(**batch(design, LENGTHS))["loss"]
    assert _rel(got, want) <= 2e-3


@pytest.mark.parametrize("tile", [128, 64])
def test_flex_window_attention_matches_the_reference_in_training_shapes(tile: int) -> None:
    from tibnlp.models.attention.flex import flex_window_attention
    from tibnlp.models.attention.multiscale import Scale, reference_window_attention

    torch.manual_seed(0)
    lengths = torch.tensor([512, 300, 129, 7], device="cuda")
    b, h, n, d = 4, 6, 512, 32
    q, k, v = (torch.randn(b, h, n, d, device="cuda", requires_grad=True) for _ in range(3))
    scales = ["3", "5", "N/16", "N/8", "N/4", "N/1"]
    radius = torch.stack([Scale.parse(s).radii(lengths) for s in scales], 1)
    out = flex_window_attention(q, k, v, radius, lengths, tile=tile)
    ref = torch.cat(
        [
            reference_window_attention(
                q[:, i : i + 1], k[:, i : i + 1], v[:, i : i + 1], radius[:, i], lengths
            )
            for i in range(h)
        ],
        1,
    )
    assert _rel(out, ref) <= 2e-3
    (g_out,) = torch.autograd.grad(out.square().sum(), q)
    (g_ref,) = torch.autograd.grad(ref.square().sum(), q)
    assert _rel(g_out, g_ref) <= 2e-3


def test_sdpa_kernel_report_names_the_fast_kernels() -> None:
    from benchmarks.gpu import kernels

    rows = kernels.report("cuda", seq=128)
    print("\n" + kernels.markdown(rows))
    by = {(r["design"], r["batch"]): r for r in rows}
    # bf16: dense attention takes a fused kernel, never math. Without padding flash or cuDNN
    # (torch 2.11 ranks cuDNN first on an H100, 2026-11-25); a padding mask rules flash out and a
    # kernel that takes masks serves it (memory-efficient or cuDNN)
    assert set(by[("dense", "full")]["used"]) <= {"flash", "cuDNN"}
    assert set(by[("dense", "padded")]["used"]) <= {"memory-efficient", "cuDNN"}
    assert "flash" not in by[("dense", "padded")]["used"]
    assert by[("multi-scale", "padded")]["used"] == ["FlexAttention"]


@pytest.mark.parametrize(("mode", "extra"), [("segments", []), ("memory", MEMORY)])
def test_long_document_readings_run_on_cuda(env, mode: str, extra: list[str]) -> None:  # noqa: F811
    """Through the public entry point (`run_finetune` with `finetune.long_document` and
    `finetune.device=cuda`), with the settings the CPU tests give the tiny model (the default
    memory budget, 128, does not fit its 64 positions: the 2026-11-27 lease failed on it)."""
    from tibnlp.training.finetune import run_finetune

    result = run_finetune(_cfg(env, mode, *extra, "finetune.device=cuda"), "tncc")
    seed = result.seeds[0]
    assert seed.metrics["test"].count == 12
    assert torch.cuda.max_memory_allocated() > 0


@pytest.mark.parametrize("name", ["dense", "relative"])
def test_compiled_pretraining_on_cuda_equals_eager(name: str) -> None:
    """Inductor on CUDA, the way benchmarks/gpu/speed.py compiles (one graph: see
    tests/test_compile.py): loss and gradients equal eager CUDA's in fp32 within 1e-4."""
    import torch._dynamo as dynamo

    from tibnlp.models.pretraining import DYNAMO_CAPTURE

    design = next(d for d in designs() if d.name == name)
    eager = build(design).cuda()
    traced = copy.deepcopy(eager)
    inputs = batch(design, LENGTHS, device="cuda")
    loss_e, g_e = _loss_and_grads(eager, inputs)
    dynamo.reset()
    with dynamo.config.patch(**DYNAMO_CAPTURE):
        loss_c = torch.compile(traced, fullgraph=True)(**inputs)["loss"]
        loss_c.backward()
    g_c = {n: p.grad for n, p in traced.named_parameters() if p.grad is not None}
    assert _rel(loss_c, loss_e) <= 1e-4
    assert g_c.keys() == g_e.keys()
    for key in g_e:
        assert _rel(g_c[key], g_e[key]) <= 1e-4, key
