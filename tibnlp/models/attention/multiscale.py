"""Multi-scale windowed heads (Guo et al. 2019; MODELS.md section 3).

A head of scale `w` (odd) lets query `i` attend to keys `i-(w-1)/2 .. i+(w-1)/2` of the same
sequence and never to padding. Scales are constants ("3") or fractions of each sequence's own
real length ("N/16"), rounded to the nearest odd number >= 1 (ties to the larger).

Speed on CPU (FlexAttention cannot train through inductor there): heads of width 1 return
their value vector; small windows gather their neighbours with `unfold` (a banded product,
O(N w)); wide windows use blocked local attention (blocks of at least the radius, each query
block scores its own and the two neighbouring key blocks, O(3 N r)); a window that covers the
whole sequence falls back to fused dense attention. `reference_window_attention` is the dense
masked softmax that tests check the fast paths against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tibnlp.models.attention.base import AttentionContext, AttentionCore

BAND_MAX_RADIUS = 4  # up to w = 9 the unfold band beats blocked matmuls
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
        z = [alpha * (num_layers - layer) * (num_scales - 1 - k) for k in range(num_scales)]
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
    big_r = int(radius.max())
    w = 2 * big_r + 1
    n = q.shape[-2]
    kw = F.pad(k, (0, 0, big_r, big_r)).unfold(2, w, 1)  # [B,h,N,d,w]
    vw = F.pad(v, (0, 0, big_r, big_r)).unfold(2, w, 1)
    scores = (q.unsqueeze(-1) * kw).sum(-2) / math.sqrt(q.shape[-1])  # [B,h,N,w]
    pos = torch.arange(n, device=q.device)
    kpos = pos[:, None] + torch.arange(-big_r, big_r + 1, device=q.device)[None, :]
    mask = _allowed(pos[:, None], kpos, radius, lengths).unsqueeze(1)  # [B,1,N,w]
    p = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    p = F.dropout(p, dropout, training)
    return (vw * p.unsqueeze(-2)).sum(-1)


def _blocked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    radius: torch.Tensor,
    lengths: torch.Tensor,
    dropout: float,
    training: bool,
) -> torch.Tensor:
    big_r = int(radius.max())
    s = max(MIN_BLOCK, 8 * math.ceil(big_r / 8))  # block >= radius: neighbours suffice
    b, h, n, d = q.shape
    nb = math.ceil(n / s)
    tail = nb * s - n
    qb = F.pad(q, (0, 0, 0, tail)).view(b, h, nb, s, d)
    kb = F.pad(k, (0, 0, s, s + tail)).unfold(2, 3 * s, s)  # [B,h,nb,d,3s]
    vb = F.pad(v, (0, 0, s, s + tail)).unfold(2, 3 * s, s).transpose(-1, -2)  # [B,h,nb,3s,d]
    scores = (qb @ kb) / math.sqrt(d)  # [B,h,nb,s,3s]
    blk = torch.arange(nb, device=q.device).view(nb, 1, 1) * s
    qpos = blk + torch.arange(s, device=q.device).view(1, s, 1)
    kpos = blk - s + torch.arange(3 * s, device=q.device).view(1, 1, 3 * s)
    mask = _allowed(qpos, kpos, radius, lengths).unsqueeze(1)  # [B,1,nb,s,3s]
    p = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    p = F.dropout(p, dropout, training)
    return (p @ vb).reshape(b, h, nb * s, d)[:, :, :n]


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
        return F.dropout(v, dropout, training)
    if bool((radius >= lengths - 1).all()):  # the window covers every real token
        mask = None if int(lengths.min()) == n else _allowed_dense_keys(lengths, n)
        p = dropout if training else 0.0
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
    if big_r <= BAND_MAX_RADIUS:
        return _banded(q, k, v, radius, lengths, dropout, training)
    return _blocked(q, k, v, radius, lengths, dropout, training)


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

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext
    ) -> torch.Tensor:
        counts = self.distribution[min(ctx.layer, len(self.distribution) - 1)]
        outs, start = [], 0
        for scale, count in zip(self.scales, counts, strict=True):
            if count == 0:
                continue
            sl = slice(start, start + count)
            radius = scale.radii(ctx.lengths)
            outs.append(
                window_attention(
                    q[:, sl], k[:, sl], v[:, sl], radius, ctx.lengths, self.dropout, self.training
                )
            )
            start += count
        return torch.cat(outs, dim=1)

    def reference(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext
    ) -> torch.Tensor:
        """Same result through the dense masked softmax (tests only)."""
        counts = self.distribution[min(ctx.layer, len(self.distribution) - 1)]
        outs, start = [], 0
        for scale, count in zip(self.scales, counts, strict=True):
            if count:
                sl = slice(start, start + count)
                r = scale.radii(ctx.lengths)
                outs.append(
                    reference_window_attention(q[:, sl], k[:, sl], v[:, sl], r, ctx.lengths)
                )
                start += count
        return torch.cat(outs, dim=1)
