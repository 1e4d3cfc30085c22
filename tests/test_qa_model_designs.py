"""The attention designs of MODELS.md as a demanding user meets them: configs that cannot mean
anything are refused at load naming the key, the window masks hold per head, batch mates
never change an example's output, and `tibnlp model describe` and the analytic FLOPs agree
with a count over the instantiated module."""

from __future__ import annotations

import sys

import pytest
import torch
from design_models import tiny
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode
from typer.testing import CliRunner

from tibnlp.cli.main import app, main
from tibnlp.config import load_config
from tibnlp.config.model import FusionConfig, HeadsConfig, ModelConfig, ScalesConfig
from tibnlp.errors import ConfigError
from tibnlp.models import AlbertForPretraining, Encoder
from tibnlp.models.attention import AttentionContext, head_distribution
from tibnlp.models.attention.multiscale import MultiScaleCore, Scale
from tibnlp.models.summary import describe, training_flops_per_token

DYNAMIC = ["model.heads.small=6", "model.heads.large=12"]


@pytest.mark.parametrize(
    ("overrides", "key", "says"),
    [
        # a window no sequence can fill (max_len 64)
        (["model.max_len=64", "model.scales.windows=[1, 3, 101]"], "scales.windows[2]", "101"),
        # MODELS.md: scales ascend (w_0 < w_1 < ...); reversed, alpha > 0 favoured wide heads
        (["model.scales.windows=[3, 1]"], "scales.windows[1]", "narrowest to the widest"),
        (["model.scales.windows=[1, 3, 3]"], "scales.windows[2]", "each once"),
        (["model.scales.windows=[N/4, N/16]"], "scales.windows[1]", "narrowest"),
        # str.isdigit() took it and int() then raised a ValueError traceback
        (["model.scales.windows=['³']"], "scales.windows[0]", "odd integer"),
        (["model.scales.windows=['N/٤']"], "scales.windows[0]", "odd integer"),
        # 3 scales over 2 heads: the last scale never got a head in any layer
        (
            ["model.heads={small: 2, large: 2}", "model.scales.windows=[1, 3, N/4]"],
            "scales.windows",
            "at least 3 heads",
        ),
        # FFN-free is the multi-scale layer's option: without windows it was silently ignored
        (["model.scales.ffn=false"], "scales.ffn", "multi-scale"),
        # n_i > m with 1 <= n_i <= max_len: one route would never run
        # no two tokens are max_len apart
        (["model.fusion.enabled=true", "model.fusion.radius=512"], "fusion.radius", "apart"),
    ],
)
def test_configs_that_cannot_mean_anything_are_refused_at_load(
    overrides: list[str], key: str, says: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert f"config key 'model.{key}'" in err.value.message and says in err.value.message


@pytest.mark.parametrize(
    "overrides",
    [
        ["model.max_len=64", "model.scales.windows=[1, 3, 63, N/2]"],  # widest odd that fits
        ["model.scales.windows=[1, 3, N/16, N/8, N/4]"],  # the paper's scales
        ["model.scales.windows=[N/16, 3]"],  # kinds compare differently at different lengths
        ["model.scales.windows=[N/2, 1, 3]", "model.scales.ffn=false"],
        [
            "model.hidden_size=30",
            "model.heads={small: 3, large: 3}",
            "model.scales.windows=[1,3,5]",
        ],
        [*DYNAMIC, "model.heads.threshold=1"],
        [*DYNAMIC, "model.heads.threshold=511"],
        [*DYNAMIC, "model.heads.threshold=512"],  # auto can resolve to max_len: loads
        [*DYNAMIC, "model.heads.threshold=auto"],
        ["model.heads.threshold=0"],  # fixed heads: the threshold is never read
        ["model.fusion.enabled=true", "model.fusion.radius=511"],
        ["model.scales.windows=[1, 3]", "model.scales.alpha=-3"],
    ],
)
def test_edge_configs_that_mean_something_still_load(overrides: list[str]) -> None:
    load_config(None, overrides)


@pytest.mark.parametrize("alpha", [1e308, -1e308, 1e4, 750.0])
def test_a_huge_alpha_saturates_instead_of_crashing(alpha: float) -> None:
    """alpha * (L - l) * (K - 1 - k) overflowed to inf, inf - inf = nan, and `model describe`
    died in math.floor(nan); a large alpha is the limit: every lower layer on one scale."""
    dist = head_distribution(4, 8, 3, alpha)
    edge = [8, 0, 0] if alpha > 0 else [0, 0, 8]
    assert dist == [edge, edge, edge, [3, 3, 2]]
    args = ["model", "describe", "-s", "model.scales.windows=[1, 3, N/4]"]
    result = CliRunner().invoke(app, [*args, "-s", f"model.scales.alpha={alpha!r}"])
    assert result.exit_code == 0, result.output


def test_describe_refuses_a_nonsense_config_naming_the_key(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["-s", "model.max_len=64", "-s", "model.scales.windows=[1, 101]"]
    monkeypatch.setattr(sys, "argv", ["tibnlp", "model", "describe", *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err.replace("\n", "")
    assert exit_.value.code not in (0, None)
    assert "model.scales.windows[1]" in err and "Traceback" not in err


def test_every_head_sees_exactly_its_window_on_a_padded_batch() -> None:
    """Per head, per query: the value positions an output depends on are exactly
    |i - j| <= (w - 1) / 2 within the row's real tokens, on every CPU path (width 1, shifted
    slices, blocked, a window covering the row) and for N/k read from the real length."""
    torch.manual_seed(0)
    windows = ["1", "3", "5", "N/8", "N/4", "N/2", "N/1"]
    core = MultiScaleCore(len(windows), windows, 0.0, 1).eval()
    assert core.distribution == [[1] * len(windows)]  # alpha 0, one layer: head i has scale i
    lengths = torch.tensor([64, 50, 23, 7, 1])
    b, n, h, d = len(lengths), 64, len(windows), 4
    ctx = AttentionContext(torch.arange(n)[None] < lengths[:, None], lengths)
    q, k = torch.randn(b, h, n, d), torch.randn(b, h, n, d)
    v = torch.randn(b, h, n, d, requires_grad=True)
    out = core(q, k, v, ctx)
    radii = torch.stack([Scale.parse(w).radii(lengths) for w in windows], 1)  # [B, h]
    pos = torch.arange(n)
    for i in range(0, n, 3):
        (grad,) = torch.autograd.grad(out[:, :, i].sum(), v, retain_graph=True)
        seen = grad.abs().sum(-1) > 0  # [B, h, N]
        want = ((pos - i).abs()[None, None] <= radii[..., None]) & (
            pos[None, None] < lengths[:, None, None]
        )
        real = i < lengths  # a padding query's output is not read
        assert torch.equal(seen[real], want[real]), i


MS = ScalesConfig(windows=["1", "3", "N/4", "N/2"], alpha=0.5)
SENTENCE = HeadsConfig(2, 4, threshold=4, rule="sentence")
COMBINATIONS = {  # pairs test_padding_property does not run
    "multiscale_pre_norm_unshared": tiny(scales=MS, norm="pre", share_layers=False, num_layers=3),
    "fusion_pre_norm": tiny(fusion=FusionConfig(enabled=True, radius=2), norm="pre"),
    "memory_tokens_dynamic_sentence": tiny(memory_tokens=2, heads=SENTENCE),
    "memory_tokens_pre_norm_unshared": tiny(memory_tokens=3, norm="pre", share_layers=False),
}


@pytest.mark.parametrize("name", sorted(COMBINATIONS))
def test_an_examples_output_does_not_depend_on_its_batch_mates(name: str) -> None:
    """Reordered batch mates, extra [PAD] columns, or the row alone: the same real outputs."""
    torch.manual_seed(0)
    enc = Encoder(COMBINATIONS[name]).eval()
    lengths = [9, 5, 1, 8, 3]
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, 40, (5, 11), generator=g)
    mask = (torch.arange(11)[None, :] < torch.tensor(lengths)[:, None]).long()
    perm = torch.tensor([4, 2, 0, 3, 1])
    with torch.no_grad():
        out = enc(ids, mask).hidden
        torch.testing.assert_close(enc(ids[perm], mask[perm]).hidden, out[perm])
        wide = enc(torch.cat([ids, ids[:, :6]], 1), torch.cat([mask, 0 * mask[:, :6]], 1))
        torch.testing.assert_close(wide.hidden[:, :11], out)
        for i, n in enumerate(lengths):
            alone = enc(ids[i : i + 1, :n], mask[i : i + 1, :n]).hidden[0]
            torch.testing.assert_close(out[i, :n], alone, rtol=1e-5, atol=1e-5)


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


DESCRIBED = {
    "unshared_dynamic_multiscale": tiny(
        share_layers=False, num_layers=3, scales=MS, heads=HeadsConfig(4, 8, threshold=5)
    ),
    "memory_tokens_pre_norm": tiny(memory_tokens=3, norm="pre"),
    "fusion_dynamic": tiny(fusion=FusionConfig(enabled=True), heads=HeadsConfig(2, 4, 5)),
    "relative_unshared": tiny(position="relative", share_layers=False),
}


@pytest.mark.parametrize("name", sorted(DESCRIBED))
def test_describe_counts_what_the_module_holds(name: str) -> None:
    """Each route line is that route's weights over every layer that owns one (it was the
    first layer's only, with unshared layers), the parts add up to the encoder (memory tokens
    and the pre-norm final norm were in no line), and the head table is what the cores run."""
    cfg = DESCRIBED[name]
    summary = describe(cfg)
    model = AlbertForPretraining(cfg)
    enc = model.encoder
    layers = [enc.layer_at(i) for i in range(cfg.num_layers)]
    owners = list({id(layer): layer for layer in layers}.values())
    p = summary.parameters
    for h in sorted({cfg.heads.small, cfg.heads.large}):
        line = f"attention route h={h}" + ("" if cfg.share_layers else f", {cfg.num_layers} layers")
        assert p[line] == sum(_count(layer.attention.route(h)) for layer in owners)  # type: ignore[operator]
        if cfg.scales.enabled:
            for layer in owners:
                core = layer.attention.route(h).core  # type: ignore[operator]
                assert summary.distributions[h] == core.distribution
    assert p["embeddings"] == _count(enc.embeddings)
    layer_line = "shared layer (all)" if cfg.share_layers else f"{cfg.num_layers} unshared layers"
    assert p[layer_line] == sum(_count(layer) for layer in owners)
    rest = p.get("memory tokens", 0) + p.get("final norm (norm: pre)", 0)
    assert p["embeddings"] + p[layer_line] + rest == p["encoder"] == _count(enc)
    assert p["total"] == _count(model) == p["encoder"] + p["pretraining heads (MLM + SOP)"]


FLOP_DESIGNS = {
    "dense": tiny(),
    "fusion": tiny(fusion=FusionConfig(enabled=True, radius=2)),
    "memory_tokens": tiny(memory_tokens=4),
    "fusion_unshared": tiny(fusion=FusionConfig(enabled=True, radius=1), share_layers=False),
}


def _measured_flops_per_token(cfg: ModelConfig, n: int, rows: int) -> float:
    """Training FLOPs (3 x forward) per input token as torch counts them, SDPA decomposed
    into counted matmuls."""
    ids = torch.randint(5, 40, (rows, n), generator=torch.Generator().manual_seed(0))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        Encoder(cfg)(ids, torch.ones_like(ids))
    return 3 * counter.get_total_flops() / (rows * n)


@pytest.mark.parametrize("name", sorted(FLOP_DESIGNS))
def test_analytic_flops_match_the_counted_matmuls(name: str) -> None:
    """The FLOPs a run records (its budget and the comparison table read them) counted one
    attention and an FFN for every design: RPSAN's three masked attentions and gate came out
    at 37% of what runs, memory tokens' extra positions were free."""
    cfg = FLOP_DESIGNS[name]
    assert training_flops_per_token(cfg, 16, 0.0) == _measured_flops_per_token(cfg, 16, 4)


def test_ffn_free_multiscale_flops_drop_exactly_the_ffn() -> None:
    """`scales.ffn: false` has no FFN; its FLOPs counted one anyway (windowed heads are a
    dense upper bound on both sides, so the difference is compared)."""
    with_ffn, ffn_free = tiny(scales=MS), tiny(scales=ScalesConfig(windows=MS.windows, ffn=False))
    measured = [_measured_flops_per_token(c, 16, 4) for c in (with_ffn, ffn_free)]
    analytic = [training_flops_per_token(c, 16, 0.15) for c in (with_ffn, ffn_free)]
    ffn = 6 * 2 * 2 * 32 * 48  # 6 x layers x (D x FFN twice) in the tiny shape
    assert measured[0] - measured[1] == analytic[0] - analytic[1] == ffn
