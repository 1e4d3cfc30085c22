"""Local and directional masks with gated fusion (RPSAN, Xu and Li; MODELS.md section 5).

Three masked self-attentions of the layer input `v`, each with its own routes (own Q/K/V and
output projections, fixed or dynamic heads like any attention):

- forward  `S_Fw`: token j attends only to tokens after it (i > j);
- backward `S_Bw`: only to tokens before it (i < j);
- distant  `S_Dt`: only to tokens with 1 <= |i - j| <= radius (itself excluded).

Padding keys are never visible. A row with no visible key (the last real token under the
forward mask, the first under the backward mask, a one-token sequence under any) has the
zero vector as attention context, so its `S` is the output projection's bias: defined,
finite, and never NaN in the backward pass (`masked_softmax`).

Fusion: gates `a = softmax over the 4 sources of (W^T v + b)`, per position and per
dimension (`W` is D x 4D), output `a_v*v + a_Fw*S_Fw + a_Dt*S_Dt + a_Bw*S_Bw`. The module
replaces the layer's attention, so ALBERT's residual and LayerNorm still wrap it
(norm(v + fusion(v))): the layer stays the same for every design.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from tibnlp.models.attention.base import AttentionContext, AttentionCore, masked_softmax

KINDS = ("forward", "distant", "backward")  # the order of the gate's sources after `v`
_KEY = {"forward": "fw", "distant": "dt", "backward": "bw"}  # ModuleDict has a .forward


def visible(kind: str, n: int, radius: int, device: torch.device | None = None) -> torch.Tensor:
    """[N, N] bool: may query j (row) see key i (column) under mask `kind`."""
    pos = torch.arange(n, device=device)
    offset = pos[None, :] - pos[:, None]  # key - query
    if kind == "forward":
        return offset > 0
    if kind == "backward":
        return offset < 0
    if kind == "distant":
        return (offset != 0) & (offset.abs() <= radius)
    raise ValueError(f"unknown mask kind {kind!r}; expected one of {KINDS}")


class MaskedCore(AttentionCore):
    """Scaled dot-product attention under one of the three RPSAN masks."""

    def __init__(self, heads: int, kind: str, radius: int, dropout: float = 0.0) -> None:
        super().__init__(heads)
        visible(kind, 1, radius)  # validates `kind`
        self.kind, self.radius, self.dropout = kind, radius, dropout

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext
    ) -> torch.Tensor:
        n = q.shape[-2]
        allowed = visible(self.kind, n, self.radius, q.device)[None] & ctx.key_mask[:, None, :]
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        p = masked_softmax(scores, allowed.unsqueeze(1))  # [B, h, N, N]
        p = nn.functional.dropout(p, self.dropout, self.training)
        return p @ v


class FusionAttention(nn.Module):
    """The layer's attention when `model.fusion.enabled`: three masked branches and the gate.

    `make_branch(kind)` builds one branch (a `RoutedAttention` over `MaskedCore(kind)`), so
    dynamic heads apply to each branch exactly as to plain attention.
    """

    def __init__(self, hidden: int, make_branch: Callable[[str], nn.Module]) -> None:
        super().__init__()
        self.branches = nn.ModuleDict({_KEY[kind]: make_branch(kind) for kind in KINDS})
        self.gate = nn.Linear(hidden, 4 * hidden)

    def branch(self, kind: str) -> nn.Module:
        """The `RoutedAttention` of mask `kind` ('forward', 'distant' or 'backward')."""
        return self.branches[_KEY[kind]]

    def route(self, heads: int) -> nn.Module:
        """The three branches' routes for `heads` (for parameter counts)."""
        return nn.ModuleList(b.route(heads) for b in self.branches.values())  # type: ignore[operator]

    def sources(
        self, x: torch.Tensor, ctx: AttentionContext, large: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """The three masked representations S_Fw, S_Dt, S_Bw, each [B, N, D]."""
        return {kind: self.branch(kind)(x, ctx, large) for kind in KINDS}

    def gates(self, x: torch.Tensor) -> torch.Tensor:
        """[B, N, 4, D]: softmax over the sources (v, Fw, Dt, Bw) per position and dimension."""
        b, n, d = x.shape
        return torch.softmax(self.gate(x).view(b, n, 4, d), dim=2)

    def forward(self, x: torch.Tensor, ctx: AttentionContext, large: torch.Tensor) -> torch.Tensor:
        s = self.sources(x, ctx, large)
        stacked = torch.stack([x, s["forward"], s["distant"], s["backward"]], dim=2)
        return (self.gates(x) * stacked).sum(dim=2)
