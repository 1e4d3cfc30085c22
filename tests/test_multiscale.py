"""Multi-scale windowed heads (MODELS.md section 3): distribution, windows, fast paths."""

from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tibnlp.config.model import HeadsConfig, ModelConfig, ScalesConfig
from tibnlp.models import AlbertForPretraining, Encoder
from tibnlp.models.attention import AttentionContext, head_distribution
from tibnlp.models.attention.multiscale import (
    MultiScaleCore,
    Scale,
    odd_window,
    reference_window_attention,
    window_attention,
)


@given(
    layers=st.integers(1, 6),
    heads=st.integers(1, 16),
    k=st.integers(1, 6),
    alpha=st.floats(-2, 2, allow_nan=False),
)
@example(layers=5, heads=7, k=4, alpha=0.3515625)  # counts not monotone in depth: rounding
@settings(max_examples=200, deadline=None)
def test_distribution_contract(layers: int, heads: int, k: int, alpha: float) -> None:
    dist = head_distribution(layers, heads, k, alpha)
    assert len(dist) == layers and all(sum(c) == heads and min(c) >= 0 for c in dist)
    top = dist[-1]
    assert max(top) - min(top) <= 1  # top layer uniform (up to rounding)
    if alpha == 0:
        assert all(c == top for c in dist)
    # MODELS.md: layer l's counts are softmax(z^l) * h, z_k = alpha (L - l)(K - 1 - k), rounded
    # by largest remainder: each count the floor or the ceiling of its share. (The shares of
    # small-scale heads never grow with depth for alpha > 0; the rounded counts need not
    # follow: (5, 7, 4, 0.35) gives [5, 1, 1, 0] then [5, 2, 0, 0], each layer rounded alone.)
    for layer, counts in enumerate(dist, start=1):
        z = [alpha * (layers - layer) * (k - 1 - i) for i in range(k)]
        e = [math.exp(v - max(z)) for v in z]
        shares = [heads * v / sum(e) for v in e]
        for count, share in zip(counts, shares, strict=True):
            assert math.floor(share + 1e-9) <= count <= math.ceil(share - 1e-9)


def test_distribution_paper_setting() -> None:
    dist = head_distribution(3, 10, 5, 0.5)
    assert dist[2] == [2, 2, 2, 2, 2]
    assert dist[0][0] > dist[1][0] > dist[2][0]


def test_scale_windows_are_nearest_odd_of_real_length() -> None:
    assert [odd_window(n, 16) for n in (1, 16, 48, 64, 100, 112, 512)] == [1, 1, 3, 5, 7, 7, 33]
    assert Scale.parse("N/8").radii(torch.tensor([8, 40])).tolist() == [0, 2]
    assert Scale.parse("3").radii(torch.tensor([8, 40])).tolist() == [1, 1]
    assert str(Scale.parse("N/4")) == "N/4"


@pytest.mark.parametrize("radii", [[0, 0], [1, 1], [2, 4], [3, 9], [7, 12], [40, 40], [1, 60]])
def test_fast_paths_equal_dense_reference(radii: list[int]) -> None:
    torch.manual_seed(0)
    b, h, n, d = 2, 3, 50, 8
    lengths = torch.tensor([50, 31])
    radius = torch.tensor(radii)
    q, k, v = (torch.randn(b, h, n, d, dtype=torch.float64, requires_grad=True) for _ in "qkv")
    fast = window_attention(q, k, v, radius, lengths)
    ref = reference_window_attention(q, k, v, radius, lengths)
    real = (torch.arange(n)[None, :] < lengths[:, None])[:, None, :, None]
    torch.testing.assert_close(fast * real, ref * real)
    g_fast = torch.autograd.grad((fast * real).sum(), (q, k, v), allow_unused=True)
    g_ref = torch.autograd.grad((ref * real).sum(), (q, k, v))
    for a, c in zip(g_fast, g_ref, strict=True):
        # Width-1 heads never read q or k: their gradient there is exactly zero.
        torch.testing.assert_close(torch.zeros_like(c) if a is None else a, c)


def test_core_matches_reference_per_layer() -> None:
    torch.manual_seed(1)
    core = MultiScaleCore(6, ["1", "3", "N/8", "N/2"], alpha=1.0, num_layers=3)
    q, k, v = torch.randn(3, 2, 6, 40, 4).unbind(0)
    lengths = torch.tensor([40, 17])
    mask = torch.arange(40)[None, :] < lengths[:, None]
    for layer in range(3):
        ctx = AttentionContext(mask, lengths, layer, 3)
        real = mask[:, None, :, None]
        torch.testing.assert_close(core(q, k, v, ctx) * real, core.reference(q, k, v, ctx) * real)


def ms_cfg(windows: list[str], heads: int = 4, layers: int = 1, **kw: object) -> ModelConfig:
    return ModelConfig(
        vocab_size=40,
        embedding_size=8,
        hidden_size=24,
        num_layers=layers,
        ffn_size=32,
        max_len=128,
        dropout=0.0,
        attention_dropout=0.0,
        heads=HeadsConfig(small=heads, large=heads),
        scales=ScalesConfig(windows=windows, alpha=0.5, **kw),  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("windows", [["1", "3"], ["3", "N/8"], ["1", "5", "N/16", "N/4"]])
def test_token_outside_every_window_cannot_change_output(windows: list[str]) -> None:
    torch.manual_seed(0)
    enc = Encoder(ms_cfg(windows)).eval()  # one layer: its output is the first-layer output
    n, p = 64, 10
    ids = torch.randint(1, 40, (1, n))
    mask = torch.ones(1, n, dtype=torch.long)
    reach = max(int(Scale.parse(w).radii(torch.tensor([n]))) for w in windows)
    base = enc(ids, mask).hidden[0, p]
    outside = ids.clone()
    outside[0, p + reach + 1 :] = (outside[0, p + reach + 1 :] % 39) + 1  # changed, still real
    assert torch.equal(enc(outside, mask).hidden[0, p], base)
    inside = ids.clone()
    inside[0, p + reach] = (inside[0, p + reach] % 39) + 1
    assert not torch.allclose(enc(inside, mask).hidden[0, p], base)


def test_fractional_scales_follow_real_length_not_padding() -> None:
    torch.manual_seed(0)
    enc = Encoder(ms_cfg(["N/16"], heads=2)).eval()
    ids = torch.randint(1, 40, (2, 128))
    mask = torch.ones(2, 128, dtype=torch.long)
    mask[1, 48:] = 0  # 48 real tokens: window 3 (radius 1), not the padded 128's 9
    out = enc(ids, mask).hidden
    alone = enc(ids[1:, :48], mask[1:, :48]).hidden
    torch.testing.assert_close(out[1, :48], alone[0], rtol=1e-5, atol=1e-5)
    p = 20
    changed = ids.clone()
    changed[1, p + 2] = (changed[1, p + 2] % 39) + 1  # outside radius 1 of position p
    assert torch.equal(enc(changed, mask).hidden[1, p], out[1, p])


def test_padding_invariance_multi_layer() -> None:
    torch.manual_seed(0)
    enc = Encoder(ms_cfg(["1", "3", "N/8", "N/4"], heads=4, layers=3)).eval()
    ids = torch.randint(1, 40, (3, 70))
    lengths = torch.tensor([70, 33, 12])
    mask = (torch.arange(70)[None, :] < lengths[:, None]).long()
    out = enc(ids, mask).hidden
    for i, n in enumerate(lengths.tolist()):
        alone = enc(ids[i : i + 1, :n], mask[i : i + 1, :n]).hidden[0]
        torch.testing.assert_close(out[i, :n], alone, rtol=1e-5, atol=1e-5)


def test_ffn_free_layer() -> None:
    cfg = ms_cfg(["1", "3"], ffn=False)
    enc = Encoder(cfg).eval()
    names = [n for n, _ in enc.named_parameters()]
    assert not any("ffn" in n for n in names)
    ids = torch.randint(1, 40, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    out = enc(ids, mask)
    assert (out.hidden.abs().sum(-1) > 0).all()


def test_dynamic_heads_get_their_own_distribution() -> None:
    cfg = ms_cfg(["1", "3", "N/4"], heads=4, layers=2)
    cfg.heads = HeadsConfig(small=4, large=6, threshold=8, rule="sentence")
    enc = Encoder(cfg).eval()
    small = enc.layer.attention.route(4).core
    large = enc.layer.attention.route(6).core
    assert [sum(c) for c in small.distribution] == [4, 4]  # type: ignore[union-attr]
    assert [sum(c) for c in large.distribution] == [6, 6]  # type: ignore[union-attr]
    ids = torch.randint(1, 40, (2, 20))
    mask = (torch.arange(20)[None, :] < torch.tensor([20, 5])[:, None]).long()
    assert enc(ids, mask).large.tolist() == [True, False]


def test_model_describe_command() -> None:
    from typer.testing import CliRunner

    from tibnlp.cli.main import app

    args = ["model", "describe", "-s", "model.scales.windows=[1, 3, N/4]"]
    args += ["-s", "model.heads={small: 6, large: 12, threshold: auto}"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "h=6" in result.output and "h=12" in result.output and "N/4" in result.output
    from tibnlp.models.summary import describe

    s = describe(ModelConfig(scales=ScalesConfig(windows=["1", "3", "N/4"])))
    assert s.distributions[12][-1] == [4, 4, 4]
    assert s.parameters["total"] > s.parameters["encoder"] > 0


@pytest.mark.parametrize(
    ("sets", "heads"),
    [
        ([], "MLM + SOP"),
        (["pretrain.sop=false"], "MLM"),
        (["pretrain.sop=false", "pretrain.contrastive=0.1"], "MLM + contrast"),
        (["pretrain.objective=electra", "pretrain.sop=false"], "ELECTRA generator + RTD"),
    ],
)
def test_model_describe_counts_the_heads_pretraining_builds(sets: list[str], heads: str) -> None:
    """Its counts were always of MLM + SOP: a SOP head that `pretrain.sop=false` does not
    build was counted, and ELECTRA's generator and RTD head were not."""
    from typer.testing import CliRunner

    from tibnlp.cli.main import app
    from tibnlp.models.electra import ElectraForPretraining

    args = ["model", "describe", *(x for kv in sets for x in ("-s", kv))]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    cfg = ModelConfig()
    built = {
        "MLM + SOP": AlbertForPretraining(cfg),
        "MLM": AlbertForPretraining(cfg, sop=False),
        "MLM + contrast": AlbertForPretraining(cfg, sop=False, contrastive=0.1),
        "ELECTRA generator + RTD": ElectraForPretraining(cfg),
    }[heads]
    total = sum(p.numel() for p in built.parameters())
    assert f"pretraining heads ({heads})" in result.output
    assert re.search(rf"total\s*│\s*{total:,}\s", result.output), result.output


def test_route_skips_qk_of_width_one_heads_without_changing_the_result() -> None:
    torch.manual_seed(0)
    enc = Encoder(ms_cfg(["1", "3", "N/4"], heads=6, layers=2)).eval()
    route = enc.layer.attention.route(6)
    core = route.core
    assert isinstance(core, MultiScaleCore)
    x = torch.randn(2, 30, 24)
    lengths = torch.tensor([30, 19])
    mask = torch.arange(30)[None, :] < lengths[:, None]
    for layer in range(2):
        ctx = AttentionContext(mask, lengths, layer, 2)
        assert core.pointwise_heads(ctx) == core.distribution[layer][0]
        q, k, v = route.qkv(x).view(2, 30, 3, 6, 4).permute(2, 0, 3, 1, 4)
        ref = core.reference(q, k, v, ctx)
        expected = route.out(ref.transpose(1, 2).reshape(2, 30, 24))
        real = mask[..., None]
        torch.testing.assert_close(route(x, ctx) * real, expected * real)


def test_width_one_heads_drop_their_attention_weight_not_value_elements() -> None:
    """Attention dropout drops attention weights: a width-1 head's only weight (1 on its own
    position) is dropped or kept whole, so each head output is 0 or v / (1 - p), never a
    mix of dropped and kept elements (as SDPA/the banded path do on their weights)."""
    torch.manual_seed(0)
    b, h, n, d = 2, 4, 12, 8
    q, k = (torch.randn(b, h, n, d) for _ in "qk")
    v = torch.randn(b, h, n, d).abs() + 1  # no zero element: zero means dropped
    lengths = torch.tensor([12, 7])
    mask = torch.arange(n)[None, :] < lengths[:, None]
    core = MultiScaleCore(h, ["1", "N/64"], alpha=0.0, num_layers=1, dropout=0.5).train()
    ctx = AttentionContext(mask, lengths)
    assert core.pointwise_heads(ctx) == 2
    outs = [core(q[:, 2:], k[:, 2:], v, ctx)]  # heads 0-1: "1"; heads 2-3: N/64 -> width 1
    outs.append(window_attention(q, k, v, torch.zeros(b, dtype=torch.long), lengths, 0.5, True))
    for out in outs:
        kept = out != 0
        assert kept.any() and (~kept).any()
        assert bool((kept.all(-1) | (~kept).all(-1)).all())  # whole vectors kept or dropped
        torch.testing.assert_close(out[kept], 2 * v[kept])
