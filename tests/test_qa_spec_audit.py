"""Conformance of the attention designs to MODELS.md sections 2-6, property by property, where
the other design tests left a property or formula unpinned; and the analytic FLOPs of segment
recurrence (its memory keys were free)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import yaml
from design_models import tiny
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

from tibnlp.config import load_config
from tibnlp.config.core import from_dict
from tibnlp.config.model import (
    FusionConfig,
    HeadsConfig,
    ModelConfig,
    RecurrenceConfig,
    ScalesConfig,
)
from tibnlp.models import Encoder
from tibnlp.models.attention import AttentionContext, MaskedCore, RelativeCore, head_distribution
from tibnlp.models.attention.base import Route
from tibnlp.models.attention.multiscale import MultiScaleCore, Scale, reference_window_attention
from tibnlp.models.attention.relative import reference_relative_scores
from tibnlp.models.summary import training_flops_per_token

D = 32  # design_models.tiny: D 32, 2 layers, 4 heads, no dropout


def full_ctx(b: int, n: int, layer: int = 0, layers: int = 1) -> AttentionContext:
    return AttentionContext(torch.ones(b, n, dtype=torch.bool), torch.full((b,), n), layer, layers)


def padded(lengths: list[int], n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 40, (len(lengths), n), generator=g)
    mask = (torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]).long()
    return ids * mask, mask


# --- Section 2: dynamic multi-head attention -------------------------------------------------


@pytest.mark.parametrize("heads", [4, 8])
def test_a_route_is_h_scaled_dot_product_heads_concatenated_through_its_own_w_h(
    heads: int,
) -> None:
    """DMA(Q,K,V) = Concat(head_1..head_h) W_h with head_i the usual scaled dot-product
    attention of width D/h, and the two routes share no weight."""
    torch.manual_seed(0)
    enc = Encoder(tiny(heads=HeadsConfig(4, 8, threshold=3))).eval()
    route = enc.layer.attention.route(heads)
    other = enc.layer.attention.route(12 - heads)
    assert not {id(p) for p in route.parameters()} & {id(p) for p in other.parameters()}
    x = torch.randn(2, 7, D)
    w, b = route.qkv.weight, route.qkv.bias
    dh = D // heads
    heads_out = []
    for i in range(heads):
        cols = slice(i * dh, (i + 1) * dh)
        q = x @ w[:D][cols].T + b[:D][cols]
        k = x @ w[D : 2 * D][cols].T + b[D : 2 * D][cols]
        v = x @ w[2 * D :][cols].T + b[2 * D :][cols]
        heads_out.append(torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dh), -1) @ v)
    expected = torch.cat(heads_out, -1) @ route.out.weight.T + route.out.bias
    torch.testing.assert_close(route(x, full_ctx(2, 7)), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rule", ["batch", "sentence"])
def test_the_routing_threshold_counts_real_tokens_only(rule: str) -> None:
    """n_i is the real tokens of a sequence: not the padded width, not the [MEM] slots the
    encoder prepends, not the recurrence memory. Batch rule: large iff sum n_i > m * B."""
    m = 5
    heads = HeadsConfig(2, 4, threshold=m, rule=rule)  # type: ignore[arg-type]
    enc = Encoder(tiny(memory_tokens=3, heads=heads)).eval()
    at = [m, m - 2, m + 2] if rule == "batch" else [m, m, m]  # sum = m * B
    ids, mask = padded(at, 12)
    assert enc(ids, mask).large.tolist() == [False] * 3
    above = [n + 1 for n in at[:1]] + at[1:]
    ids, mask = padded(above, 12)
    want = [True] * 3 if rule == "batch" else [True, False, False]
    assert enc(ids, mask).large.tolist() == want
    rec = Encoder(tiny(position="relative", recurrence=RecurrenceConfig(8), heads=heads)).eval()
    ids, mask = padded([m], m)
    memory = rec(*padded([8], 8, seed=1)).memory
    assert rec(ids, mask, memory=memory).large.tolist() == [False]


# --- Section 3: multi-scale windowed heads ---------------------------------------------------


def test_head_counts_are_the_closed_form_by_largest_remainder() -> None:
    """z_k = alpha (L - l)(K - 1 - k), n = softmax(z) h rounded by largest remainder.
    alpha 0.5, L 3, h 10, K 5, by hand: layer 1 z = [4,3,2,1,0], shares 6.36 2.34 0.86 0.32
    0.12, floors [6,2,0,0,0], the two largest remainders (0.86, 0.36) -> [7,2,1,0,0]; layer 2
    z = [2,1.5,1,.5,0], shares 4.29 2.60 1.58 0.96 0.58 -> floors [4,2,1,0,0] + the three
    largest remainders (0.96, 0.60, 0.58) -> [4,3,1,1,1]; layer 3 uniform."""
    assert head_distribution(3, 10, 5, 0.5) == [[7, 2, 1, 0, 0], [4, 3, 1, 1, 1], [2] * 5]
    # alpha < 0 mirrors the scales: shallow layers favour wide windows
    assert head_distribution(3, 10, 5, -0.5) == [[0, 0, 1, 2, 7], [1, 1, 1, 3, 4], [2] * 5]
    # alpha 0 is uniform everywhere; equal remainders go to the smaller scales
    assert head_distribution(4, 10, 4, 0.0) == [[3, 3, 2, 2]] * 4
    for alpha in (0.3, -0.3, 0.0):
        for heads, k in ((6, 3), (12, 4), (16, 5)):
            dist = head_distribution(4, heads, k, alpha)
            assert all(sum(c) == heads for c in dist)
            assert dist[-1] == head_distribution(1, heads, k, 0.0)[0]  # top layer uniform
            small, wide = dist[0][0] - dist[-1][0], dist[0][-1] - dist[-1][-1]
            assert (small > 0, wide < 0) == (alpha > 0, alpha > 0)
            assert (small < 0, wide > 0) == (alpha < 0, alpha < 0)


def test_a_head_ignores_a_key_and_value_outside_its_own_window() -> None:
    """Per head: moving token p's key and value changes query i's output iff |i - p| is
    within that head's radius (each head its own scale: 1, 3, 7, N/4 of the real length)."""
    torch.manual_seed(0)
    windows = ["1", "3", "7", "N/4"]
    core = MultiScaleCore(4, windows, 0.0, 1).eval()
    n, lengths = 40, torch.tensor([40, 26])
    ctx = AttentionContext(torch.arange(n)[None] < lengths[:, None], lengths)
    q, k, v = torch.randn(3, 2, 4, n, 8).unbind(0)
    out = core(q, k, v, ctx)
    radii = torch.stack([Scale.parse(w).radii(lengths) for w in windows], 1)  # [B, h]
    for p in (3, 17):
        k2, v2 = k.clone(), v.clone()
        k2[:, :, p] += 2.0
        v2[:, :, p] += 2.0
        moved = (core(q, k2, v2, ctx) - out).abs().amax(-1) > 1e-6  # [B, h, N]
        pos = torch.arange(n)
        within = (pos - p).abs()[None, None] <= radii[..., None]
        real = (pos[None] < lengths[:, None])[:, None].expand_as(within)
        assert torch.equal(moved[real], within[real]), p


class _Shapes(TorchDispatchMode):
    """Every tensor shape an op produces."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.shapes += [tuple(t.shape) for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        return out


def test_windowed_heads_never_build_the_n_by_n_score_matrix() -> None:
    """Section 3: windowed heads must not compute the full N x N scores (the dense reference
    does, which shows the probe sees it)."""
    n = 256
    core = MultiScaleCore(8, ["1", "3", "9", "N/16"], 0.0, 1).eval()
    lengths = torch.tensor([256, 200])
    ctx = AttentionContext(torch.arange(n)[None] < lengths[:, None], lengths)
    q, k, v = torch.randn(3, 2, 8, n, 4).unbind(0)

    def square(shapes: list[tuple[int, ...]]) -> bool:
        return any(len(s) >= 2 and s[-2:] == (n, n) for s in shapes)

    with _Shapes() as fast:
        core(q, k, v, ctx)
    assert fast.shapes and not square(fast.shapes)
    with _Shapes() as dense:
        reference_window_attention(q, k, v, torch.tensor([4, 4]), lengths)
    assert square(dense.shapes)


def test_every_layer_runs_its_own_window_assignment_on_shared_weights() -> None:
    heads = HeadsConfig(8, 8)
    cfg = tiny(num_layers=3, heads=heads, scales=ScalesConfig(["1", "3", "N/4"], alpha=1.0))
    enc = Encoder(cfg).eval()
    core = enc.layer.attention.route(8).core
    assert isinstance(core, MultiScaleCore) and not len(enc.later_layers)
    seen: list[list[int]] = []
    core.register_forward_pre_hook(lambda mod, args: seen.append(mod.counts(args[3])))
    enc(*padded([10], 10))
    assert seen == core.distribution and len({tuple(c) for c in seen}) == 3


def test_the_ffn_free_layer_is_norm_of_input_plus_relu_of_attention() -> None:
    torch.manual_seed(0)
    enc = Encoder(tiny(scales=ScalesConfig(["1", "3"], ffn=False))).eval()
    layer = enc.layer
    x, ctx, large = torch.randn(2, 9, D), full_ctx(2, 9), torch.zeros(2, dtype=torch.bool)
    a = layer.attention(x, ctx, large)
    expected = layer.attention_norm(x + F.relu(a))
    assert (a < 0).any()  # ReLU has something to cut
    torch.testing.assert_close(layer(x, ctx, large), expected)


# --- Section 4: Transformer-XL ---------------------------------------------------------------


def test_each_term_of_the_relative_score_is_present_and_relative() -> None:
    """(q_i.k_j + q_i.W_R R_(i-j) + u.k_j + v.W_R R_(i-j)) / sqrt(d), term by term, with R
    written out (sin half, cos half): u's term depends on the key only, the v and q_i.R terms
    on i - j only."""
    torch.manual_seed(0)
    h, d, n, m = 2, 8, 5, 3
    core = RelativeCore(h, h * d)
    with torch.no_grad():
        core.u.normal_()
        core.v.normal_()
    k = torch.randn(1, h, m + n, d)
    dist = torch.arange(m, m + n)[:, None] - torch.arange(m + n)[None, :]  # (M + i) - j
    inv = 1.0 / 10000 ** (torch.arange(0, h * d, 2) / (h * d))
    angles = dist[..., None].float() * inv
    r = torch.cat([angles.sin(), angles.cos()], -1)  # [N, K, D]
    wr = core.r_proj(r).view(n, m + n, h, d).permute(2, 0, 1, 3)  # [h, N, K, d]
    zero_q = torch.zeros(1, h, n, d)
    with torch.no_grad():
        biases = core.scores(zero_q, k)[0] * math.sqrt(d)
        u_term = (core.u[:, None, :] * k[0]).sum(-1)[:, None, :]  # [h, 1, K]
        v_term = (core.v[:, None, None, :] * wr).sum(-1)  # [h, N, K]
        torch.testing.assert_close(biases, u_term + v_term, rtol=1e-5, atol=1e-5)
        for i in range(1, n):  # Toeplitz: shifting query and key together keeps the term
            torch.testing.assert_close(v_term[:, i, 1:], v_term[:, i - 1, :-1])
        q = torch.randn(1, h, n, d)
        scores = core.scores(q, k)[0] * math.sqrt(d)
        content = q[0] @ k[0].transpose(-1, -2)
        position = (q[0][:, :, None, :] * wr).sum(-1)
        torch.testing.assert_close(scores, content + position + u_term + v_term)
        assert min(t.abs().max() for t in (content, position, u_term, v_term)) > 0.1


def test_queries_come_from_the_segment_keys_and_values_from_memory_and_segment() -> None:
    torch.manual_seed(0)
    h, n, m = 4, 5, 3
    route = Route(D, h, RelativeCore(h, D), 0.0).eval()
    with torch.no_grad():
        route.core.u.normal_()
        route.core.v.normal_()
    x, mem = torch.randn(1, n, D), torch.randn(1, m, D)
    ctx = AttentionContext(
        torch.ones(1, n, dtype=torch.bool),
        torch.tensor([n]),
        memory=mem,
        memory_mask=torch.ones(1, m, dtype=torch.bool),
    )
    out = route(x, ctx)
    assert out.shape == (1, n, D)  # one output per segment position, none for the memory
    w, b = route.qkv.weight, route.qkv.bias
    full = torch.cat([mem, x], 1)
    q = (x @ w[:D].T + b[:D]).view(1, n, h, -1).transpose(1, 2)
    k = (full @ w[D : 2 * D].T + b[D : 2 * D]).view(1, m + n, h, -1).transpose(1, 2)
    v = (full @ w[2 * D :].T + b[2 * D :]).view(1, m + n, h, -1).transpose(1, 2)
    with torch.no_grad():
        p = torch.softmax(reference_relative_scores(route.core, q, k), -1)  # type: ignore[arg-type]
        expected = route.out((p @ v).transpose(1, 2).reshape(1, n, D))
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_every_layers_memory_is_its_input_one_segment_back_gradient_stopped() -> None:
    enc = Encoder(tiny(num_layers=3, position="relative", recurrence=RecurrenceConfig(6)))
    ids, mask = padded([6, 6], 6)
    out = enc(ids, mask, states=(0, 1, 2))
    assert out.memory is not None and out.states is not None
    assert len(out.memory.states) == 3
    for layer_input, memory in zip(out.states, out.memory.states, strict=True):
        torch.testing.assert_close(memory, layer_input.detach())
        assert not memory.requires_grad and memory.grad_fn is None


@pytest.mark.parametrize("layers", [1, 2])
def test_the_longest_dependency_is_layers_times_segment(layers: int) -> None:
    """mem_len = S: a token reaches the output `layers` segments later, never one more."""
    torch.manual_seed(0)
    s = 4
    enc = Encoder(tiny(num_layers=layers, position="relative", recurrence=RecurrenceConfig(s)))
    enc = enc.eval()
    segs = [padded([s], s, seed=i)[0] for i in range(layers + 2)]
    ones = torch.ones(1, s, dtype=torch.long)

    def outputs(first: torch.Tensor) -> list[torch.Tensor]:
        memory, outs = None, []
        for seg in [first, *segs[1:]]:
            out = enc(seg, ones, memory=memory)
            memory, outs = out.memory, [*outs, out.hidden]
        return outs

    base = segs[0].clone()
    moved = base.clone()
    moved[0, 1] = 39 if int(base[0, 1]) != 39 else 38
    a, b = outputs(base), outputs(moved)
    reached = [not torch.allclose(x, y, atol=1e-6) for x, y in zip(a, b, strict=True)]
    assert reached == [True] * (layers + 1) + [False]


# --- Section 5: RPSAN masks and fusion -------------------------------------------------------


@pytest.mark.parametrize("kind", ["forward", "backward", "distant"])
def test_no_mask_reads_a_tokens_own_value_and_each_reads_its_side(kind: str) -> None:
    torch.manual_seed(0)
    core = MaskedCore(2, kind, radius=2).eval()
    n, j = 9, 4
    ctx = full_ctx(1, n)
    q, k, v = torch.randn(3, 1, 2, n, 8).unbind(0)
    base = core(q, k, v, ctx)
    for p in range(n):
        v2 = v.clone()
        v2[:, :, p] += 3.0
        changed = not torch.allclose(core(q, k, v2, ctx)[:, :, j], base[:, :, j])
        sees = {"forward": p > j, "backward": p < j, "distant": 1 <= abs(p - j) <= 2}[kind]
        assert changed == sees, p


def test_fusion_gates_are_per_position_and_dimension_and_radius_defaults_to_3() -> None:
    assert FusionConfig().radius == 3  # the paper's best c (SST)
    torch.manual_seed(0)
    enc = Encoder(tiny(fusion=FusionConfig(enabled=True), initializer_range=1.0))
    g = enc.layer.attention.gates(torch.randn(1, 5, D))  # [B, N, 4 sources, D]
    torch.testing.assert_close(g.sum(2), torch.ones(1, 5, D))
    assert (g[0, 0] - g[0, 1]).abs().max() > 1e-3  # positions differ
    assert (g[0, 0, :, 0] - g[0, 0, :, 1]).abs().max() > 1e-3  # dimensions differ


# --- Section 6: memory tokens ----------------------------------------------------------------


def test_memory_tokens_attend_to_every_real_token_and_to_no_padding() -> None:
    torch.manual_seed(0)
    enc = Encoder(tiny(memory_tokens=2)).eval()
    firsts: list[torch.Tensor] = []

    def keep_first(mod: Any, args: Any, out: torch.Tensor) -> None:
        if args[1].layer == 0:
            firsts.append(out[:, :2])  # the [MEM] slots after the first layer

    enc.layer.register_forward_hook(keep_first)
    ids, mask = padded([6], 9)
    assert enc(ids, mask).hidden.shape == (1, 9, D)  # dropped from the outputs
    for p in range(9):
        other = ids.clone()
        other[0, p] = 39 if int(ids[0, p]) != 39 else 38
        enc(other, mask)
        moved = (firsts[-1] - firsts[0]).abs().amax(-1)[0]  # per [MEM] slot
        assert bool((moved > 1e-6).all()) == (p < 6) and bool((moved > 1e-6).any()) == (p < 6)


# --- Analytic FLOPs --------------------------------------------------------------------------


@pytest.mark.parametrize(("mem_len", "memory_tokens"), [(8, 0), (24, 0), (8, 2), (0, 0)])
def test_recurrence_flops_count_what_torch_counts(mem_len: int, memory_tokens: int) -> None:
    """Encoder FLOPs of a segment read with a full memory (torch's count of its matmuls,
    3 x forward) are the analytic count plus W_R's projection of the distance table, which
    runs once per batch (the analytic count is per token and leaves it out)."""
    rec = RecurrenceConfig(mem_len)
    cfg = tiny(position="relative", recurrence=rec, memory_tokens=memory_tokens)
    enc = Encoder(cfg).eval()
    rows, n = 4, 16
    ids = torch.randint(5, 40, (rows, n), generator=torch.Generator().manual_seed(0))
    ones = torch.ones_like(ids)
    memory = None
    while mem_len and (memory is None or memory.mask.shape[1] < mem_len):
        memory = enc(ids, ones, memory=memory).memory
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        enc(ids, ones, memory=memory)
    measured = 3 * counter.get_total_flops() / (rows * n)
    positions = n + memory_tokens
    distances = mem_len + 2 * positions - 1  # W_R R_r for every r, once per layer and batch
    r_proj = 3 * 2 * distances * D * D * cfg.num_layers / (rows * n)
    assert measured == pytest.approx(training_flops_per_token(cfg, n, 0.0) + r_proj, rel=1e-12)


def test_recurrence_flops_grow_by_the_memory_keys_only() -> None:
    """Per input token and layer: scores + mixing over M more keys (12 M D), the relative
    term over M more distances (6 M D), and the memory's K and V projections (6 x 2 D^2 M /
    S). Nothing else moves."""
    base = load_config(None, ["model.position=relative"]).model
    for m, seq_len, mask_prob in ((128, 128, 0.15), (64, 512, 0.3)):
        rec = ModelConfig(**{**vars(base), "recurrence": RecurrenceConfig(m)})
        d, layers = base.hidden_size, base.num_layers
        grow = layers * (12 * m * d + 6 * m * d + 6 * 2 * d * d * m / seq_len)
        plain = training_flops_per_token(base, seq_len, mask_prob)
        assert training_flops_per_token(rec, seq_len, mask_prob) - plain == pytest.approx(grow)


def test_flops_of_the_default_and_quickstart_shapes_are_unchanged() -> None:
    """The counts recorded before recurrence was counted (the vocabulary size each run saw:
    28,932 pieces for the default shape, 14,274 for the quickstart's)."""
    cfg = load_config(None, ["model.vocab_size=28932"])
    default = training_flops_per_token(cfg.model, cfg.pretrain.seq_len, cfg.pretrain.mask_prob)
    assert round(default) == 48_498_739
    path = Path(__file__).parents[1] / "pipelines" / "quickstart.yaml"
    spec = yaml.safe_load(path.read_text())["config"]
    model = from_dict(ModelConfig, {**spec["model"], "vocab_size": 14274}, "model")
    pretrain = spec["pretrain"]
    quick = training_flops_per_token(model, pretrain["seq_len"], pretrain["mask_prob"])
    assert round(quick) == 9_704_909
