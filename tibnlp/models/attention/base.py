"""The attention interface every design implements, and the per-route projections they share.

A design splits into two parts so the later designs (relative positions, masks, memory) can
reuse the routing: a `Route` owns one head count's Q/K/V and output projections (DMA-ALBERT's
`W_h`), and an `AttentionCore` turns projected `q, k, v` into per-head outputs (dense SDPA,
multi-scale windows, ...). `AttentionContext` carries what a core may need about the batch.
"""

from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class AttentionContext:
    """Facts about the batch that stay fixed across the (weight-shared) layers.

    `attention_mask` is [B, N] bool with real tokens as a prefix of each row (right padding);
    `lengths` [B] is its row sum. `layer` is the 0-based index of the layer being run.
    `memory` [B, M, D] (segment recurrence): this layer's states of the previous segment,
    prepended to the keys/values by `Route`; `memory_mask` [B, M] bool marks its real tokens.
    Only cores that accept memory (relative) are built with recurrence on.
    `queries` [B, Q] long (right-padded with any valid position): run the queries only at
    these positions of each row, keys/values at all of them; only layers whose cores declare
    `supports_query_subset` get it (the last layer of pretraining: the heads read few outputs).
    """

    attention_mask: torch.Tensor
    lengths: torch.Tensor
    layer: int = 0
    num_layers: int = 1
    memory: torch.Tensor | None = None
    memory_mask: torch.Tensor | None = None
    queries: torch.Tensor | None = None

    def select(self, index: torch.Tensor) -> AttentionContext:
        """The context of a sub-batch (rows `index`), for routing sequences separately."""
        return dataclasses.replace(
            self,
            attention_mask=self.attention_mask.index_select(0, index),
            lengths=self.lengths.index_select(0, index),
            memory=None if self.memory is None else self.memory.index_select(0, index),
            memory_mask=None
            if self.memory_mask is None
            else self.memory_mask.index_select(0, index),
            queries=None if self.queries is None else self.queries.index_select(0, index),
        )

    def gather_queries(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, N, D] at the query positions: [B, Q, D] (x itself without `queries`)."""
        if self.queries is None:
            return x
        return x.gather(1, self.queries.unsqueeze(-1).expand(-1, -1, x.shape[-1]))

    def at_layer(self, layer: int) -> AttentionContext:
        return dataclasses.replace(self, layer=layer)

    @property
    def key_mask(self) -> torch.Tensor:
        """[B, M + N] bool: which keys are real (memory first, then the current tokens)."""
        if self.memory_mask is None:
            return self.attention_mask
        return torch.cat([self.memory_mask, self.attention_mask], dim=1)


def masked_softmax(scores: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim restricted to `allowed`; a row with no allowed key gets all
    zero weights (its attention output is the zero vector), never NaN, in forward or backward.
    """
    lowest = torch.finfo(scores.dtype).min
    p = torch.softmax(scores.masked_fill(~allowed, lowest), dim=-1)
    return p * allowed.to(p.dtype)


class AttentionCore(nn.Module, abc.ABC):
    """Per-head attention: `q, k, v` [B, h, N, d] -> [B, h, N, d]. Parameter-free by default.

    A core may declare leading "pointwise" heads (attending to their own position only, e.g.
    a window of width 1) through `pointwise_heads`: for those the route skips the Q and K
    projections, and `q`, `k` then hold only heads `pointwise_heads(ctx):`.

    `supports_query_subset`: the core is exact when `q` holds fewer positions than `k, v`
    (the rows of `ctx.queries`); cores whose pattern depends on the query's position
    (windows, relative distances, directional masks) leave it False and get full layers.
    """

    supports_query_subset: bool = False

    def __init__(self, heads: int) -> None:
        super().__init__()
        self.heads = heads

    def pointwise_heads(self, ctx: AttentionContext) -> int:
        return 0

    @abc.abstractmethod
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext
    ) -> torch.Tensor:
        """Each design's per-head attention."""


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
        """[B, N, D] -> [B, N, D], or [B, Q, D] at `ctx.queries` when given."""
        b, n, d = x.shape
        skip = self.core.pointwise_heads(ctx)
        if ctx.queries is not None and not self.core.supports_query_subset:
            raise ValueError(f"{type(self.core).__name__} cannot run a subset of queries")
        if ctx.memory is not None or ctx.queries is not None:
            # keys/values over [memory; x] (recurrence) and all positions; queries from x
            # at the requested positions only
            w, bias = self.qkv.weight, self.qkv.bias
            xq = ctx.gather_queries(x)
            n = xq.shape[1]
            q = F.linear(xq, w[:d], bias[:d]).view(b, n, self.heads, self.head_dim).transpose(1, 2)
            full = x if ctx.memory is None else torch.cat([ctx.memory.to(x.dtype), x], dim=1)
            kv = F.linear(full, w[d:], bias[d:]).view(b, full.shape[1], 2, self.heads, -1)
            k, v = kv.permute(2, 0, 3, 1, 4).unbind(0)
        elif skip == 0:
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
