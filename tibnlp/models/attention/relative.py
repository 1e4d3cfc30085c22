"""Transformer-XL relative attention (Dai et al. 2019; MODELS.md section 4).

Score of query i and key j, both indexed in the concatenation [memory; segment] (query i of
the segment sits at M + i), with distance r = (M + i) - j:

    (q_i.k_j + q_i.(W_R R_r) + u.k_j + v.(W_R R_r)) / sqrt(d)

`R` is the sinusoidal encoding of the distance, `W_R` a projection owned by the core, `u`, `v`
learned per-head global biases. The encoder is bidirectional, so distances run from
-(N - 1) to M + N - 1: the positional term is computed once per distance (K + N - 1 of them,
K = M + N keys) and moved into place with the skew (rel-shift) trick, a reshape instead of an
[N, K] gather. `reference_relative_scores` is the direct O(N K) formula the tests check.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from tibnlp.models.attention.base import AttentionContext, AttentionCore, masked_softmax


def sinusoid(distances: torch.Tensor, dim: int) -> torch.Tensor:
    """[P, dim] sinusoidal encodings of (float) distances, sin half then cos half."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=distances.device) / dim))
    angles = distances.float()[:, None] * inv_freq[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=-1)[:, :dim]


def rel_shift(x: torch.Tensor, keys: int) -> torch.Tensor:
    """[..., N, P] indexed by distance slot -> [..., N, K] with out[i, j] = x[i, j + N - 1 - i].

    Slot p holds distance (K - 1) - p. Row i of the flattened (one-column padded) tensor
    starting at offset N - 1 and read with stride P advances one slot left per row, which is
    exactly the diagonal shift; no index tensor is materialised.
    """
    *lead, n, p = x.shape
    x = F.pad(x, (0, 1))  # P + 1 columns keeps N = 1 (and any K <= P) in range
    flat = x.reshape(*lead, n * (p + 1))
    shifted = flat[..., n - 1 : n - 1 + n * p].reshape(*lead, n, p)
    return shifted[..., :keys]


class RelativeCore(AttentionCore):
    """Relative-position attention; owns `W_R` and the biases `u`, `v` of its route."""

    def __init__(self, heads: int, hidden: int, dropout: float = 0.0) -> None:
        super().__init__(heads)
        self.hidden = hidden
        self.head_dim = hidden // heads
        self.r_proj = nn.Linear(hidden, hidden, bias=False)  # W_R
        self.u = nn.Parameter(torch.zeros(heads, self.head_dim))
        self.v = nn.Parameter(torch.zeros(heads, self.head_dim))
        self.dropout = dropout

    def position_keys(self, n: int, k: int, device: torch.device) -> torch.Tensor:
        """[h, K + N - 1, d]: W_R R_r for the distances r = K - 1 down to -(N - 1)."""
        dist = torch.arange(k - 1, -n, -1, device=device)
        r = self.r_proj(sinusoid(dist, self.hidden).to(self.r_proj.weight.dtype))
        return r.view(-1, self.heads, self.head_dim).transpose(0, 1)

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """[B, h, N, K] unmasked scaled scores (q from the segment, k over memory + segment)."""
        n, keys = q.shape[-2], k.shape[-2]
        content = (q + self.u[None, :, None, :]) @ k.transpose(-1, -2)  # AC
        rk = self.position_keys(n, keys, q.device)
        position = rel_shift((q + self.v[None, :, None, :]) @ rk.transpose(-1, -2), keys)  # BD
        return (content + position) / math.sqrt(self.head_dim)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext
    ) -> torch.Tensor:
        allowed = ctx.key_mask[:, None, None, :]  # [B, 1, 1, K]
        p = masked_softmax(self.scores(q, k), allowed)
        p = F.dropout(p, self.dropout, self.training)
        return p @ v


def reference_relative_scores(core: RelativeCore, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The score formula term by term, one (i, j) pair at a time (tests only)."""
    b, h, n, d = q.shape
    keys = k.shape[-2]
    m = keys - n
    out = torch.empty(b, h, n, keys, dtype=q.dtype)
    for i in range(n):
        for j in range(keys):
            r = torch.tensor([float(m + i - j)])
            wr = core.r_proj(sinusoid(r, core.hidden))[0].view(h, d)  # [h, d]
            qi, kj = q[:, :, i], k[:, :, j]  # [B, h, d]
            s = (qi * kj).sum(-1) + (qi * wr).sum(-1) + (core.u * kj).sum(-1)
            s = s + (core.v * wr).sum(-1)
            out[:, :, i, j] = s / math.sqrt(d)
    return out
