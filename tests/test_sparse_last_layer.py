"""The last layer at the read positions only (`Encoder.forward(outputs_at=...)`): the selected
outputs, the pretraining losses and every gradient equal the full computation's; designs whose
cores cannot run a subset of queries fall back to the full layer."""

from __future__ import annotations

import pytest
import torch
from design_models import tiny

from tibnlp.config.model import HeadsConfig, ModelConfig, ScalesConfig
from tibnlp.models import Encoder
from tibnlp.models.attention import AttentionContext
from tibnlp.models.pretraining import AlbertForPretraining

DESIGNS = {
    "dense": {},
    "dense, 1 layer": {"num_layers": 1},
    "dynamic heads, batch rule": {"heads": HeadsConfig(small=2, large=4, threshold=5)},
    "dynamic heads, sentence rule (mixed batch)": {
        "heads": HeadsConfig(small=2, large=4, threshold=5, rule="sentence")
    },
    "memory tokens": {"memory_tokens": 2},
    "pre-LN": {"norm": "pre"},
    "pre-LN, dynamic heads": {"norm": "pre", "heads": HeadsConfig(small=2, large=4, threshold=5)},
}


def _batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Four rows of real lengths 9, 4, 7, 2 padded to 10 (shared padding is cut too), and a
    random 30% of real positions plus [CLS] to read."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([9, 4, 7, 2])
    mask = (torch.arange(10)[None, :] < lengths[:, None]).long()
    ids = torch.randint(5, 40, (4, 10), generator=g) * mask
    read = (torch.rand(4, 10, generator=g) < 0.3) & mask.bool()
    read[:, 0] = True
    return ids, mask, read


@pytest.mark.parametrize("design", list(DESIGNS))
def test_selected_outputs_equal_the_full_layer(design: str) -> None:
    torch.manual_seed(0)
    enc = Encoder(tiny(**DESIGNS[design])).eval()
    assert enc.supports_sparse_outputs
    ids, mask, read = _batch()
    with torch.no_grad():
        full = enc(ids, mask).hidden
        sparse = enc(ids, mask, outputs_at=read)
    torch.testing.assert_close(sparse.hidden[read], full[read], rtol=1e-5, atol=1e-5)
    assert (sparse.hidden[~read] == 0).all()
    assert sparse.hidden.shape == full.shape


def _losses_and_grads(cfg: ModelConfig, sparse: bool) -> tuple[dict, dict]:
    torch.manual_seed(0)
    model = AlbertForPretraining(cfg, sparse_last_layer=sparse)
    ids, mask, read = _batch(1)
    labels = torch.where(read, ids, torch.full_like(ids, -100))
    labels[:, 0] = -100  # [CLS] is read by SOP, never an MLM target
    labels[1, 2] = ids[1, 2]  # some row's target next to padding
    out = model(ids, mask, torch.zeros_like(ids), labels, torch.tensor([0, 1, 1, 0]))
    out["loss"].backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return {k: v.detach() for k, v in out.items()}, grads


@pytest.mark.parametrize(
    "design", ["dense", "dynamic heads, sentence rule (mixed batch)", "pre-LN"]
)
def test_pretraining_losses_and_gradients_match(design: str) -> None:
    cfg = tiny(**DESIGNS[design])
    out_s, grads_s = _losses_and_grads(cfg, sparse=True)
    out_f, grads_f = _losses_and_grads(cfg, sparse=False)
    for key in ("loss", "mask_loss", "sop_loss", "mask_accuracy", "sop_accuracy"):
        torch.testing.assert_close(out_s[key], out_f[key], rtol=1e-5, atol=1e-6)
    assert grads_s.keys() == grads_f.keys()
    for name in grads_f:
        torch.testing.assert_close(grads_s[name], grads_f[name], rtol=1e-4, atol=1e-6)


def test_designs_without_the_capability_run_the_full_layer() -> None:
    cfg = tiny(scales=ScalesConfig(windows=["1", "3", "N/4", "N/2"]))
    torch.manual_seed(0)
    enc = Encoder(cfg).eval()
    assert not enc.supports_sparse_outputs
    ids, mask, read = _batch()
    with torch.no_grad():
        torch.testing.assert_close(enc(ids, mask, outputs_at=read).hidden, enc(ids, mask).hidden)
    route = enc.layer.attention.route(4)
    ctx = AttentionContext(mask.bool(), mask.sum(1), queries=torch.zeros(4, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="subset of queries"):
        route(torch.zeros(4, 10, 32), ctx)
