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
from design_models import tiny

from benchmarks.gpu.designs import batch, build, designs
from tibnlp.data.masking import IGNORE_INDEX
from tibnlp.models.pretraining import AlbertForPretraining

FLAGS = {"capture_dynamic_output_shape_ops": True, "capture_scalar_outputs": True}


def _batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, 60, (4, 24), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 17:] = 0  # right padding in two rows
    mask[3, 9:] = 0
    labels = torch.full_like(ids, IGNORE_INDEX)
    pick = (torch.rand(ids.shape, generator=g) < 0.3) & mask.bool()
    pick[:, 1] = True
    labels[pick] = ids[pick]
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "token_type_ids": torch.zeros_like(ids),
        "mlm_labels": labels,
        "sop_labels": torch.tensor([0, 1, 1, 0]),
    }


def _model() -> AlbertForPretraining:
    torch.manual_seed(0)
    return AlbertForPretraining(tiny(vocab_size=60, dropout=0.0))


ONE_GRAPH = ("dense", "relative", "masked fusion (RPSAN)", "memory tokens")


@pytest.mark.parametrize("name", ONE_GRAPH)
def test_the_pretraining_model_traces_as_one_graph(name: str) -> None:
    """Dense (ALBERT's), relative (the main job's) and two more designs; dynamic heads,
    multi-scale and recurrence still route on the data (10-22 breaks, benchmarks/results/gpu.md)."""
    design = next(d for d in designs() if d.name == name)
    dynamo.reset()
    with dynamo.config.patch(**FLAGS):
        report = dynamo.explain(build(design))(**batch(design, [24, 17, 24, 9]))
    assert report.graph_break_count == 0, [b.reason.splitlines()[0] for b in report.break_reasons]
    assert report.graph_count == 1


def test_compiled_loss_and_gradients_equal_eager() -> None:
    batch = _batch()
    eager, traced = _model(), _model()
    out = eager(**batch)
    out["loss"].backward()
    dynamo.reset()
    with dynamo.config.patch(**FLAGS):
        compiled = torch.compile(traced, backend="aot_eager", fullgraph=True)
        got = compiled(**batch)
        got["loss"].backward()
    for key in ("loss", "mask_loss", "mask_accuracy", "sop_loss"):
        assert torch.allclose(got[key], out[key], atol=1e-5, rtol=1e-5), key
    grads = dict(traced.named_parameters())
    for name, p in eager.named_parameters():
        assert p.grad is not None and grads[name].grad is not None, name
        assert torch.allclose(grads[name].grad, p.grad, atol=1e-5, rtol=1e-4), name


def test_eager_still_refuses_left_padding() -> None:
    batch = _batch()
    batch["attention_mask"][0, 0] = 0
    with pytest.raises(ValueError, match="right padding"):
        _model()(**batch)
