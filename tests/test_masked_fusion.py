"""RPSAN masks and gated fusion (MODELS.md section 5)."""

from __future__ import annotations

import pytest
import torch
from design_models import SENTENCE_RULE, dynamic_routes_pad_cleanly
from design_models import tiny as base_tiny

from tibnlp.config.model import FusionConfig, ModelConfig, ScalesConfig
from tibnlp.errors import ConfigError
from tibnlp.models import Encoder
from tibnlp.models.attention import AttentionContext, FusionAttention, build_attention, core_name
from tibnlp.models.attention.masked import visible

N = 9


def tiny(**kw: object) -> ModelConfig:
    return base_tiny(**{"fusion": FusionConfig(enabled=True, radius=2), **kw})


def fusion(cfg: ModelConfig | None = None) -> FusionAttention:
    torch.manual_seed(0)
    att = build_attention(cfg or tiny())
    assert isinstance(att, FusionAttention)
    return att.eval()


def run(att: FusionAttention, x: torch.Tensor, length: int = N) -> dict[str, torch.Tensor]:
    mask = torch.arange(x.shape[1])[None, :] < length
    ctx = AttentionContext(mask, torch.tensor([length]))
    return att.sources(x, ctx, torch.zeros(1, dtype=torch.bool))


def test_visible_sets() -> None:
    f, b, d = (visible(k, 5, 2) for k in ("forward", "backward", "distant"))
    assert f[1].tolist() == [False, False, True, True, True]  # only after j = 1
    assert b[3].tolist() == [True, True, True, False, False]  # only before j = 3
    assert d[2].tolist() == [True, True, False, True, True]  # 1 <= |i - j| <= 2
    assert d[0].tolist() == [False, True, True, False, False]


@pytest.mark.parametrize("kind", ["forward", "backward", "distant"])
@pytest.mark.parametrize("p", [0, 4, 8])
def test_perturbing_an_invisible_token_leaves_the_output_unchanged(kind: str, p: int) -> None:
    att = fusion()
    x = torch.randn(1, N, 32, generator=torch.Generator().manual_seed(1))
    y = x.clone()
    y[0, p] += 3.0
    a, b = run(att, x)[kind][0], run(att, y)[kind][0]
    sees_p = visible(kind, N, 2)[:, p]  # which queries j may see key p
    for j in range(N):
        if j == p:  # token p's own query moved; no mask here includes the token itself
            continue
        same = torch.allclose(a[j], b[j], atol=1e-6)
        assert same == (not bool(sees_p[j])), (kind, p, j)


def test_padding_is_invisible_and_empty_rows_are_finite() -> None:
    att = fusion()
    x = torch.randn(1, N, 32)
    y = x.clone()
    y[0, 6:] += 5.0  # padding
    a, b = run(att, x, length=6), run(att, y, length=6)
    for kind in a:
        torch.testing.assert_close(a[kind][0, :6], b[kind][0, :6])
    # The last real token has no visible key under the forward mask, the first none under
    # the backward mask: their attention context is zero, so S is the output bias.
    bias = att.branch("forward").route(4).out.bias
    torch.testing.assert_close(a["forward"][0, 5], bias)
    torch.testing.assert_close(a["backward"][0, 0], att.branch("backward").route(4).out.bias)
    one = torch.randn(1, 1, 32, requires_grad=True)
    out = att(
        one,
        AttentionContext(torch.ones(1, 1, dtype=torch.bool), torch.tensor([1])),
        torch.zeros(1, dtype=torch.bool),
    )
    out.sum().backward()
    assert torch.isfinite(out).all() and one.grad is not None and torch.isfinite(one.grad).all()


def test_gates_sum_to_one_and_fuse_the_four_sources() -> None:
    att = fusion()
    x = torch.randn(2, N, 32)
    g = att.gates(x)
    assert g.shape == (2, N, 4, 32) and bool((g > 0).all())
    torch.testing.assert_close(g.sum(dim=2), torch.ones(2, N, 32))
    ctx = AttentionContext(torch.ones(2, N, dtype=torch.bool), torch.tensor([N, N]))
    large = torch.zeros(2, dtype=torch.bool)
    s = att.sources(x, ctx, large)
    ref = g[:, :, 0] * x + g[:, :, 1] * s["forward"] + g[:, :, 2] * s["distant"]
    ref = ref + g[:, :, 3] * s["backward"]
    torch.testing.assert_close(att(x, ctx, large), ref)


def test_encoder_with_fusion_and_dynamic_heads() -> None:
    cfg = tiny(heads=SENTENCE_RULE)
    assert core_name(cfg) == "masked_fusion"
    out = dynamic_routes_pad_cleanly(cfg)
    enc = Encoder(cfg)
    enc(torch.randint(5, 40, (1, 5)), torch.ones(1, 5)).hidden.sum().backward()
    gate = enc.layer.attention.gate
    assert isinstance(gate, torch.nn.Linear) and gate.weight.grad is not None
    assert out.hidden.shape == (2, 7, 32)


def test_fusion_config_rules() -> None:
    with pytest.raises(ConfigError, match="fusion"):
        tiny(position="relative").validate("model")
    with pytest.raises(ConfigError, match="fusion"):
        tiny(scales=ScalesConfig(windows=["3"])).validate("model")
    with pytest.raises(ConfigError, match="radius"):
        tiny(fusion=FusionConfig(enabled=True, radius=0)).validate("model")
