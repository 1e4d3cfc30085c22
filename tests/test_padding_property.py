"""One property for every attention design of MODELS.md: a padded batch gives each real token
the output it gets when its row runs alone (padding never leaks into real outputs)."""

from __future__ import annotations

import pytest
import torch
from design_models import tiny

from tibnlp.config.model import (
    FusionConfig,
    HeadsConfig,
    ModelConfig,
    RecurrenceConfig,
    ScalesConfig,
)
from tibnlp.models import Encoder

LENGTHS = [9, 5, 1, 8, 3]  # odd and even, one single token; padded to N = 11
N = 11
MS = ScalesConfig(windows=["1", "3", "5", "N/4", "N/2"], alpha=0.5)

DESIGNS: dict[str, ModelConfig] = {
    "dense": tiny(),
    "dense_pre_norm": tiny(norm="pre"),
    "dense_unshared": tiny(share_layers=False),
    "dynamic_batch_all_large": tiny(heads=HeadsConfig(2, 4, threshold=0, rule="batch")),
    "dynamic_batch_all_small": tiny(heads=HeadsConfig(2, 4, threshold=99, rule="batch")),
    "dynamic_sentence": tiny(heads=HeadsConfig(2, 4, threshold=4, rule="sentence")),
    "multiscale": tiny(scales=MS, num_layers=3),
    "multiscale_ffn_free": tiny(scales=ScalesConfig(windows=["3", "N/2"], ffn=False)),
    "multiscale_dynamic": tiny(scales=MS, heads=HeadsConfig(2, 4, threshold=4, rule="sentence")),
    "relative": tiny(position="relative"),
    "relative_dynamic": tiny(
        position="relative", heads=HeadsConfig(2, 4, threshold=4, rule="sentence")
    ),
    "relative_memory_tokens": tiny(position="relative", memory_tokens=2),
    "fusion": tiny(fusion=FusionConfig(enabled=True, radius=2)),
    "fusion_dynamic": tiny(
        fusion=FusionConfig(enabled=True, radius=3),
        heads=HeadsConfig(2, 4, threshold=4, rule="sentence"),
    ),
    "memory_tokens": tiny(memory_tokens=2),
}


def _nonzero_relative_biases(enc: Encoder) -> None:
    with torch.no_grad():  # u, v are zero at init: move them so every score term is live
        for name, p in enc.named_parameters():
            if name.endswith(".core.u") or name.endswith(".core.v"):
                p.normal_(0, 0.5)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, 40, (len(LENGTHS), N), generator=g)  # padding ids are real words
    mask = (torch.arange(N)[None, :] < torch.tensor(LENGTHS)[:, None]).long()
    return ids, mask


@pytest.mark.parametrize("name", sorted(DESIGNS))
def test_padded_batch_equals_each_row_alone(name: str) -> None:
    torch.manual_seed(0)
    enc = Encoder(DESIGNS[name]).eval()
    _nonzero_relative_biases(enc)
    ids, mask = _batch()
    with torch.no_grad():
        out = enc(ids, mask)
        assert torch.isfinite(out.hidden).all()
        for i, n in enumerate(LENGTHS):
            alone = enc(ids[i : i + 1, :n], mask[i : i + 1, :n])
            assert alone.large.item() == out.large[i].item()
            torch.testing.assert_close(out.hidden[i, :n], alone.hidden[0], rtol=1e-5, atol=1e-5)
            assert out.hidden[i, n:].abs().max() == 0 if n < N else True
        # padding ids changed: no real output moves
        other = ids.masked_fill(~mask.bool(), 7)
        torch.testing.assert_close(enc(other, mask).hidden, out.hidden, rtol=0, atol=0)


RECURRENT: dict[str, dict[str, object]] = {
    "plain": {},
    "pre_norm": {"norm": "pre"},
    "memory_tokens": {"memory_tokens": 2},
    "unshared": {"share_layers": False},
    "dynamic_sentence": {"heads": HeadsConfig(2, 4, threshold=4, rule="sentence")},
}


@pytest.mark.parametrize("mem_len", [4, 16])
@pytest.mark.parametrize("variant", sorted(RECURRENT))
def test_recurrent_padded_batch_equals_each_row_alone(mem_len: int, variant: str) -> None:
    """Two segments with segment recurrence: rows padded differently in both segments keep
    the states they have alone (the memory's real states keep their distances)."""
    torch.manual_seed(0)
    rec = RecurrenceConfig(mem_len=mem_len)
    enc = Encoder(tiny(position="relative", recurrence=rec, **RECURRENT[variant])).eval()
    _nonzero_relative_biases(enc)
    ids1, mask1 = _batch()
    ids2 = _batch()[0].flip(1)
    lengths2 = [6, 11, 2, 4, 7]
    mask2 = (torch.arange(N)[None, :] < torch.tensor(lengths2)[:, None]).long()
    with torch.no_grad():
        first = enc(ids1, mask1)
        second = enc(ids2, mask2, memory=first.memory)
        for i, (n1, n2) in enumerate(zip(LENGTHS, lengths2, strict=True)):
            a1 = enc(ids1[i : i + 1, :n1], mask1[i : i + 1, :n1])
            a2 = enc(ids2[i : i + 1, :n2], mask2[i : i + 1, :n2], memory=a1.memory)
            torch.testing.assert_close(second.hidden[i, :n2], a2.hidden[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(DESIGNS))
def test_sparse_last_layer_equals_the_full_run_on_a_padded_batch(name: str) -> None:
    """`outputs_at` (the fast last layer, where a design allows it): the read positions
    equal the full run's, everything else is zero; other designs ignore it."""
    torch.manual_seed(0)
    enc = Encoder(DESIGNS[name]).eval()
    _nonzero_relative_biases(enc)
    ids, mask = _batch()
    want = (torch.rand(ids.shape, generator=torch.Generator().manual_seed(1)) < 0.4) & (mask > 0)
    want[:, 0] = True
    with torch.no_grad():
        full, sparse = enc(ids, mask).hidden, enc(ids, mask, outputs_at=want).hidden
    torch.testing.assert_close(sparse[want], full[want], rtol=1e-5, atol=1e-5)
    if enc.supports_sparse_outputs:
        assert sparse[~want].abs().max() == 0
