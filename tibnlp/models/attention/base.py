"""The attention interface every design implements, and the per-route projections they share.

A design splits into two parts so the later designs (relative positions, masks, memory) can
reuse the routing: a `Route` owns one head count's Q/K/V and output projections (DMA-ALBERT's
`W_h`), and an `AttentionCore` turns projected `q, k, v` into per-head outputs (dense SDPA,
multi-scale windows, ...). `AttentionContext` carries what a core may need about the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class AttentionContext:
    """Facts about the batch that stay fixed across the (weight-shared) layers.

    `attention_mask` is [B, N] bool with real tokens as a prefix of each row (right padding);
    `lengths` [B] is its row sum. `layer` is the 0-based index of the layer being run.
    """

    attention_mask: torch.Tensor
    lengths: torch.Tensor
    layer: int = 0
    num_layers: int = 1

    def select(self, index: torch.Tensor) -> AttentionContext:
        """The context of a sub-batch (rows `index`), for routing sequences separately."""
        return AttentionContext(
            self.attention_mask.index_select(0, index),
            self.lengths.index_select(0, index),
            self.layer,
            self.num_layers,
        )

    def at_layer(self, layer: int) -> AttentionContext:
        return AttentionContext(self.attention_mask, self.lengths, layer, self.num_layers)


class AttentionCore(nn.Module):
    """Per-head attention: `q, k, v` [B, h, N, d] -> [B, h, N, d]. Parameter-free by default.

    A core may declare leading "pointwise" heads (attending to their own position only, e.g.
    a window of width 1) through `pointwise_heads`: for those the route skips the Q and K
    projections, and `q`, `k` then hold only heads `pointwise_heads(ctx):`.
    """

    def __init__(self, heads: int) -> None:
        super().__init__()
        self.heads = heads

    def pointwise_heads(self, ctx: AttentionContext) -> int:
        return 0

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext
    ) -> torch.Tensor:
        raise NotImplementedError


class Route(nn.Module):
    """One head count: fused Q/K/V projection, a core, and the output projection."""

    def __init__(self, hidden: int, heads: int, core: AttentionCore, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = hidden // heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.core = core
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        b, n, d = x.shape
        skip = self.core.pointwise_heads(ctx)
        if skip == 0:
            qkv = self.qkv(x).view(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
        else:  # project Q and K only for the heads that read them
            w, bias = self.qkv.weight, self.qkv.bias
            rows = [slice(skip * self.head_dim, d), slice(d + skip * self.head_dim, 2 * d)]
            rows.append(slice(2 * d, 3 * d))
            y = F.linear(x, torch.cat([w[r] for r in rows]), torch.cat([bias[r] for r in rows]))
            kept = (self.heads - skip) * self.head_dim
            q, k, v = (
                part.view(b, n, -1, self.head_dim).transpose(1, 2)
                for part in y.split([kept, kept, d], dim=-1)
            )
        ctx_out = self.core(q, k, v, ctx)  # [B, h, N, hd]
        return self.dropout(self.out(ctx_out.transpose(1, 2).reshape(b, n, d)))
