"""Multi-scale windowed heads (Guo et al. 2019; MODELS.md section 3).

A head of scale `w` (odd) lets query `i` attend to keys `i-(w-1)/2 .. i+(w-1)/2` of the same
sequence and never to padding. Scales are constants ("3") or fractions of each sequence's own
real length ("N/16"), rounded to the nearest odd number >= 1 (ties to the larger).

Speed on CPU (FlexAttention cannot train through inductor there): heads of width 1 return
their value vector (and the route skips their Q/K projections); width 3 scores shifted
slices (a banded product, O(N w)); wider windows use blocked local attention (blocks of at
least the radius, each query block scores its own and both neighbouring key blocks, O(3 N r),
through fused SDPA over the blocks); a window covering the whole sequence is plain dense SDPA.
On CUDA every windowed head of a layer runs in one FlexAttention kernel with a per-head window
block mask instead (`flex.py`). `reference_window_attention` is the dense masked softmax that
tests check the fast paths against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tibnlp.models.attention.base import AttentionContext, AttentionCore
from tibnlp.models.attention.flex import BLOCK, flex_available, flex_window_attention

BAND_MAX_RADIUS = 1  # w = 3: shifted slices; wider windows: blocked fused SDPA (measured)
MIN_BLOCK = 16


@dataclass(frozen=True)
class Scale:
    """A window width: `width` tokens, or the real length divided by `divisor`."""

    width: int | None = None
    divisor: int | None = None

    @classmethod
    def parse(cls, text: str) -> Scale:
        text = text.strip()
        if text.startswith("N/"):
            return cls(divisor=int(text[2:]))
        return cls(width=int(text))

    def __str__(self) -> str:
        return f"N/{self.divisor}" if self.divisor is not None else str(self.width)

    def radii(self, lengths: torch.Tensor) -> torch.Tensor:
        """[B] long: the half-width `(w - 1) / 2` for each sequence's real length."""
        if self.width is not None:
            return torch.full_like(lengths, (self.width - 1) // 2)
        assert self.divisor is not None
        x = lengths.to(torch.float64) / self.divisor
        # nearest odd >= 1, ties to the larger: w = 2 * floor((x - 1) / 2 + 1/2) + 1
        return torch.floor((x - 1) / 2 + 0.5).clamp(min=0).to(torch.long)


def odd_window(length: int, divisor: int) -> int:
    """Width of an `N/divisor` window for a sequence of `length` real tokens."""
    r = Scale(divisor=divisor).radii(torch.tensor([length]))
    return int(2 * r.item() + 1)


def head_distribution(
    num_layers: int, heads: int, num_scales: int, alpha: float
) -> list[list[int]]:
    """Heads per scale for each layer (index 0 = first layer), summing to `heads`.

    Closed form of the paper's recursion: layer l (1-based) has logits
    `z_k = alpha * (L - l) * (K - 1 - k)`, counts `softmax(z) * heads` rounded by largest
    remainder (ties to the smaller scale). The top layer is uniform; alpha > 0 gives shallow
    layers more small-scale heads.
    """
    out = []
    for layer in range(1, num_layers + 1):
        # a logit gap of 1e4 already gives softmax weights of exactly 0 and 1: capping the
        # slope there keeps a huge |alpha| from overflowing to inf - inf = nan (same counts)
        slope = max(-1e4, min(1e4, alpha * (num_layers - layer)))
        z = [slope * (num_scales - 1 - k) for k in range(num_scales)]
        top = max(z)
        e = [math.exp(v - top) for v in z]
        share = [heads * v / sum(e) for v in e]
        counts = [math.floor(s) for s in share]
        order = sorted(range(num_scales), key=lambda k: (-(share[k] - counts[k]), k))
        for k in order[: heads - sum(counts)]:
            counts[k] += 1
        out.append(counts)
    return out


def _allowed(
    qpos: torch.Tensor, kpos: torch.Tensor, radius: torch.Tensor, lengths: torch.Tensor
) -> torch.Tensor:
    """Mask of allowed (query, key) pairs, broadcast over a leading batch dim.

    `qpos`/`kpos` broadcast against each other; `radius`/`lengths` are [B] and are expanded
    over the position dims. A padding query may see only itself (so its row is never empty).
    """
    extra = (1,) * max(qpos.dim(), kpos.dim())
    r = radius.view(-1, *extra)
    n = lengths.view(-1, *extra)
    real = ((qpos - kpos).abs() <= r) & (kpos >= 0) & (kpos < n)
    return real | ((qpos == kpos) & (qpos >= n))


def reference_window_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    radius: torch.Tensor,
    lengths: torch.Tensor,
) -> torch.Tensor:
    """Dense masked softmax over the full N x N scores: the slow reference."""
    n = q.shape[-2]
    pos = torch.arange(n, device=q.device)
    mask = _allowed(pos[:, None], pos[None, :], radius, lengths).unsqueeze(1)  # [B,1,N,N]
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v


def _banded(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    radius: torch.Tensor,
    lengths: torch.Tensor,
    dropout: float,
    training: bool,
) -> torch.Tensor:
    """One shifted slice per offset: O(N w d) with no gather (slices backprop as cheap pads)."""
    big_r = int(radius.max())
    n = q.shape[-2]
    kp = F.pad(k, (0, 0, big_r, big_r))
    vp = F.pad(v, (0, 0, big_r, big_r))
    offsets = range(2 * big_r + 1)
    scores = torch.stack([(q * kp[:, :, o : o + n]).sum(-1) for o in offsets], -1)
    scores = scores / math.sqrt(q.shape[-1])  # [B,h,N,w]
    pos = torch.arange(n, device=q.device)
    kpos = pos[:, None] + torch.arange(-big_r, big_r + 1, device=q.device)[None, :]
    mask = _allowed(pos[:, None], kpos, radius, lengths).unsqueeze(1)  # [B,1,N,w]
    p = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    p = F.dropout(p, dropout, training)
    return sum((p[..., o : o + 1] * vp[:, :, o : o + n] for o in offsets), torch.zeros_like(q))


def _neighbour_blocks(x: torch.Tensor, s: int, nb: int, tail: int) -> torch.Tensor:
    """[B,h,N,d] -> [B,h,nb,3s,d]: for each block of s positions, it and both neighbours."""
    b, h, _, d = x.shape
    xp = F.pad(x, (0, 0, s, s + tail)).reshape(b, h, nb + 2, s, d)
    return torch.cat([xp[:, :, :-2], xp[:, :, 1:-1], xp[:, :, 2:]], dim=3)


def _blocked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    radius: torch.Tensor,
    lengths: torch.Tensor,
    dropout: float,
    training: bool,
) -> torch.Tensor:
    """Blocked local attention: blocks of s >= radius, each scoring 3s keys: O(3 N s d)."""
    big_r = int(radius.max())
    s = max(MIN_BLOCK, 8 * math.ceil(big_r / 8))  # block >= radius: neighbours suffice
    b, h, n, d = q.shape
    nb = math.ceil(n / s)
    tail = nb * s - n
    qb = F.pad(q, (0, 0, 0, tail)).reshape(b, h, nb, s, d)
    kb = _neighbour_blocks(k, s, nb, tail)
    vb = _neighbour_blocks(v, s, nb, tail)
    blk = torch.arange(nb, device=q.device).view(nb, 1, 1) * s
    qpos = blk + torch.arange(s, device=q.device).view(1, s, 1)
    kpos = blk - s + torch.arange(3 * s, device=q.device).view(1, 1, 3 * s)
    mask = _allowed(qpos, kpos, radius, lengths)  # [B,nb,s,3s]
    mask = mask.unsqueeze(1).expand(b, h, nb, s, 3 * s).reshape(b, h * nb, s, 3 * s)
    # Fused SDPA over blocks (4-D: heads x blocks merged) beats matmul + softmax here.
    out = F.scaled_dot_product_attention(
        qb.reshape(b, h * nb, s, d),
        kb.view(b, h * nb, 3 * s, d),
        vb.view(b, h * nb, 3 * s, d),
        attn_mask=mask,
        dropout_p=dropout if training else 0.0,
    )
    return out.view(b, h, nb * s, d)[:, :, :n]


def window_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    radius: torch.Tensor,
    lengths: torch.Tensor,
    dropout: float = 0.0,
    training: bool = False,
) -> torch.Tensor:
    """Windowed attention for heads sharing one scale; picks the cheapest exact path."""
    big_r = int(radius.max())
    n = q.shape[-2]
    if big_r == 0:  # width 1: each query attends to itself only, with weight 1
        return _pointwise(v, dropout, training)
    if bool((radius >= lengths - 1).all()):  # the window covers every real token
        mask = None if int(lengths.min()) == n else _allowed_dense_keys(lengths, n)
        p = dropout if training else 0.0
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
    if big_r <= BAND_MAX_RADIUS:
        return _banded(q, k, v, radius, lengths, dropout, training)
    return _blocked(q, k, v, radius, lengths, dropout, training)


def _pointwise(v: torch.Tensor, dropout: float, training: bool) -> torch.Tensor:
    """Width-1 heads: the context is the value itself (one attention weight, 1). Attention
    dropout drops that weight, so the whole vector is kept (scaled) or zeroed, as dropout on
    the probabilities of the wider windows (and SDPA) does; an elementwise F.dropout(v)
    would be a different noise (MODELS.md section 3: a width-1 head is a window like any)."""
    if not training or dropout == 0:
        return v
    return F.dropout(v.new_ones(*v.shape[:-1], 1), dropout, True) * v


def _allowed_dense_keys(lengths: torch.Tensor, n: int) -> torch.Tensor:
    pos = torch.arange(n, device=lengths.device)
    keys = pos[None, :] < lengths[:, None]  # [B,N]
    return keys[:, None, None, :]


class MultiScaleCore(AttentionCore):
    """Heads grouped by scale; the grouping changes per layer, the projections are shared."""

    def __init__(
        self,
        heads: int,
        scales: list[str],
        alpha: float,
        num_layers: int,
        dropout: float = 0.0,
    ) -> None:
        super().__init__(heads)
        self.scales = [Scale.parse(s) for s in scales]
        self.distribution = head_distribution(num_layers, heads, len(self.scales), alpha)
        self.dropout = dropout
        self.tile = BLOCK  # FlexAttention's tile on CUDA (flex.TILES); the speed benchmark sets 64

    def counts(self, ctx: AttentionContext) -> list[int]:
        return self.distribution[min(ctx.layer, len(self.distribution) - 1)]

    def pointwise_heads(self, ctx: AttentionContext) -> int:
        first = self.scales[0]
        return self.counts(ctx)[0] if first.width == 1 else 0

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext
    ) -> torch.Tensor:
        return self._run(q, k, v, ctx, reference=False)

    def reference(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext
    ) -> torch.Tensor:
        """Same result through the dense masked softmax (tests only)."""
        return self._run(q, k, v, ctx, reference=True)

    def _run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        ctx: AttentionContext,
        reference: bool,
    ) -> torch.Tensor:
        offset = v.shape[1] - q.shape[1]  # heads whose q/k the route did not project
        if not reference and flex_available(q) and (self.dropout == 0 or not self.training):
            return self._flex(q, k, v, ctx, offset)
        outs, start = [], 0
        for scale, count in zip(self.scales, self.counts(ctx), strict=True):
            if count == 0:
                continue
            sl = slice(start, start + count)
            radius = scale.radii(ctx.lengths)
            if start < offset:  # pointwise heads: q and k are absent
                assert scale.width == 1 and start + count <= offset
                outs.append(_pointwise(v[:, sl], self.dropout, self.training and not reference))
            else:
                qsl = slice(start - offset, start - offset + count)
                args = (q[:, qsl], k[:, qsl], v[:, sl], radius, ctx.lengths)
                if reference:
                    outs.append(reference_window_attention(*args))
                else:
                    outs.append(window_attention(*args, self.dropout, self.training))
            start += count
        return torch.cat(outs, dim=1)

    def _flex(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        ctx: AttentionContext,
        offset: int,
    ) -> torch.Tensor:
        """All windowed heads in one FlexAttention call (CUDA): radius per (row, head)."""
        radii = [
            scale.radii(ctx.lengths)[:, None].expand(-1, count)
            for scale, count in zip(self.scales, self.counts(ctx), strict=True)
            if count
        ]
        if offset == v.shape[1]:  # every head is width 1
            return v
        radius = torch.cat(radii, dim=1)[:, offset:].contiguous()  # the projected heads
        out = flex_window_attention(q, k, v[:, offset:], radius, ctx.lengths, tile=self.tile)
        if offset == 0:
            return out
        return torch.cat([v[:, :offset], out], dim=1)  # width-1 heads: their own value
