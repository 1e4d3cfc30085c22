"""Transformer-XL relative attention (MODELS.md section 4): the score formula and the model."""

from __future__ import annotations

import pytest
import torch
from design_models import SENTENCE_RULE, dynamic_routes_pad_cleanly
from design_models import tiny as base_tiny

from tibnlp.config.model import ModelConfig, RecurrenceConfig, ScalesConfig
from tibnlp.errors import ConfigError
from tibnlp.models import Encoder
from tibnlp.models.attention import AttentionContext, RelativeCore, core_name, masked_softmax
from tibnlp.models.attention.relative import reference_relative_scores, rel_shift


def tiny(**kw: object) -> ModelConfig:
    return base_tiny(**{"position": "relative", "initializer_range": 0.02, **kw})


def qkv(b: int, h: int, n: int, m: int, d: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(b, h, n, d, generator=g),
        torch.randn(b, h, m + n, d, generator=g),
        torch.randn(b, h, m + n, d, generator=g),
    ]


@pytest.mark.parametrize(("n", "m"), [(1, 0), (5, 0), (4, 3), (3, 7)])
def test_scores_equal_the_reference_formula(n: int, m: int) -> None:
    torch.manual_seed(1)
    core = RelativeCore(heads=2, hidden=16)
    with torch.no_grad():  # non-zero biases so every term of the formula is exercised
        core.u.normal_()
        core.v.normal_()
    q, k, _ = qkv(2, 2, n, m, 8)
    with torch.no_grad():
        torch.testing.assert_close(
            core.scores(q, k), reference_relative_scores(core, q, k), rtol=1e-4, atol=1e-4
        )


def test_rel_shift_is_the_distance_gather() -> None:
    n, k = 3, 5
    p = k + n - 1
    x = torch.arange(n * p, dtype=torch.float).view(n, p)
    idx = torch.arange(k)[None, :] + (n - 1 - torch.arange(n))[:, None]
    torch.testing.assert_close(rel_shift(x, k), x.gather(1, idx))


def test_padding_and_memory_keys_are_masked() -> None:
    core = RelativeCore(heads=2, hidden=16).eval()
    q, k, v = qkv(1, 2, 4, 2, 8)
    mask = torch.tensor([[True, True, True, False]])
    ctx = AttentionContext(mask, mask.sum(1), memory_mask=torch.tensor([[False, True]]))
    out = core(q, k, v, ctx)
    allowed = torch.tensor([False, True, True, True, True, False])
    p = masked_softmax(core.scores(q, k), allowed[None, None, None, :])
    torch.testing.assert_close(out, p @ v)
    # Changing the value of a masked key (memory slot 0, padding slot 5) changes nothing.
    v2 = v.clone()
    v2[..., 0, :] += 10
    v2[..., 5, :] += 10
    torch.testing.assert_close(core(q, k, v2, ctx), out)


def test_no_absolute_position_embedding() -> None:
    torch.manual_seed(0)
    enc = Encoder(tiny(initializer_range=0.3)).eval()  # scores far from uniform
    assert enc.embeddings.position is None
    assert not any("position" in name for name, _ in enc.named_parameters())
    ids = torch.full((1, 6), 7)
    emb = enc.embeddings(ids, torch.zeros_like(ids))[0]
    torch.testing.assert_close(emb, emb[:1].expand(6, -1))  # the same token: the same input
    # Order still matters, through attention alone: the model is not permutation-equivariant.
    ids = torch.tensor([[5, 9, 12, 17, 23, 30]])
    perm = torch.tensor([3, 1, 5, 0, 2, 4])
    h = enc(ids, torch.ones_like(ids)).hidden[0]
    h_perm = enc(ids[:, perm], torch.ones_like(ids)).hidden[0]
    assert not torch.allclose(h_perm, h[perm], atol=1e-3)
    absolute = Encoder(tiny(position="absolute")).eval()
    assert absolute.embeddings.position is not None


def test_relative_composes_with_dynamic_heads_and_pads_cleanly() -> None:
    dynamic_routes_pad_cleanly(tiny(heads=SENTENCE_RULE))


def test_config_rules() -> None:
    assert core_name(tiny()) == "relative"
    with pytest.raises(ConfigError, match="recurrence"):
        ModelConfig(position="absolute", recurrence=RecurrenceConfig(mem_len=4)).validate("model")
    with pytest.raises(ConfigError, match="multi-scale"):
        ModelConfig(position="relative", scales=ScalesConfig(windows=["3"])).validate("model")
