"""`torch.compile` of the pretraining model: one graph, and the eager model's numbers.

Eager, the encoder reads the data on the host to skip work (the padding cut, the sparse last
layer, a full batch's unmasked attention); under compile those steps are left out so the
forward traces whole. With dynamo's capture of data-dependent output shapes (the masked-LM
selection), the pretraining model is one graph with no break. Checked with the `aot_eager`
backend (the traced graph, run by eager kernels): loss and gradients equal the eager run's on
a padded batch. Speed is a GPU question (benchmarks/gpu/speed.py, `compile`).
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo as dynamo

from benchmarks.gpu.designs import batch, build, designs
from tibnlp.models.pretraining import DYNAMO_CAPTURE

ONE_GRAPH = ("dense", "relative", "masked fusion (RPSAN)", "memory tokens")
LENGTHS = [24, 17, 24, 9]  # right-padded rows


def _design(name: str):  # type: ignore[no-untyped-def]
    return next(d for d in designs() if d.name == name)


@pytest.mark.parametrize("name", ONE_GRAPH)
def test_the_pretraining_model_traces_as_one_graph(name: str) -> None:
    """Dense (ALBERT's), relative (the main job's) and two more designs; dynamic heads,
    multi-scale and recurrence still route on the data (10-22 breaks, benchmarks/results/gpu.md)."""
    design = _design(name)
    dynamo.reset()
    with dynamo.config.patch(**DYNAMO_CAPTURE):
        report = dynamo.explain(build(design))(**batch(design, LENGTHS))
    assert report.graph_break_count == 0, [b.reason.splitlines()[0] for b in report.break_reasons]
    assert report.graph_count == 1


@pytest.mark.parametrize("name", ["dense", "relative"])
def test_compiled_loss_and_gradients_equal_eager(name: str) -> None:
    design = _design(name)
    inputs = batch(design, LENGTHS)
    eager, traced = build(design), build(design)
    out = eager(**inputs)
    out["loss"].backward()
    dynamo.reset()
    with dynamo.config.patch(**DYNAMO_CAPTURE):
        compiled = torch.compile(traced, backend="aot_eager", fullgraph=True)
        got = compiled(**inputs)
        got["loss"].backward()
    for key in ("loss", "mask_loss", "mask_accuracy", "sop_loss"):
        assert torch.allclose(got[key], out[key], atol=1e-5, rtol=1e-5), key
    grads = dict(traced.named_parameters())
    for name, p in eager.named_parameters():
        assert p.grad is not None and grads[name].grad is not None, name
        assert torch.allclose(grads[name].grad, p.grad, atol=1e-5, rtol=1e-4), name


def test_eager_still_refuses_left_padding() -> None:
    design = _design("dense")
    inputs = batch(design, LENGTHS)
    inputs["attention_mask"][0, 0] = 0
    with pytest.raises(ValueError, match="right padding"):
        build(design)(**inputs)
