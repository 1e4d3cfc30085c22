"""Dynamic multi-head attention (DMA-ALBERT, MODELS.md section 2): two routes, one per head count.

Each route has its own Q/K/V and output projections. The route is chosen from real-token
counts, never from the padded length: `rule: batch` sends the whole batch to the large route
when `sum_i n_i > threshold * B` (the paper's eq. 4); `rule: sentence` decides per sequence
(eq. 3) and runs each sub-batch through its own route only. `small == large` is the
fixed-head model: a single route, named the same way, so both load identically.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from tibnlp.config.model import HeadsConfig
from tibnlp.errors import ConfigError
from tibnlp.models.attention.base import AttentionContext, AttentionCore, Route


def numeric_threshold(heads: HeadsConfig) -> int:
    """The threshold in tokens; 'auto' must have been resolved by the data stage."""
    if not isinstance(heads.threshold, int):
        raise ConfigError(
            "config key 'model.heads.threshold' is still 'auto' when building a dynamic-head model",
            "prepare the pretraining data first (it stores the corpus median length) or set "
            "model.heads.threshold=INT",
        )
    return heads.threshold


def choose_large(lengths: torch.Tensor, heads: HeadsConfig) -> torch.Tensor:
    """[B] bool: which sequences take the large route (all False for fixed-head models)."""
    if not heads.dynamic:
        return torch.zeros_like(lengths, dtype=torch.bool)
    m = numeric_threshold(heads)
    if heads.rule == "batch":
        big = bool(int(lengths.sum()) > m * lengths.numel())
        return torch.full_like(lengths, big, dtype=torch.bool)
    return lengths > m


@contextmanager
def per_text_routing(module: nn.Module) -> Iterator[int]:
    """Inside the block every batch-rule dynamic encoder in `module` routes each text by its
    own length (the sentence rule): what scoring the texts one at a time gives, at batch speed
    (each route runs on its own sub-batch; padding changes no row). Outside it, a text's
    route depends on the batch it is scored in. Yields how many encoders were switched."""
    switched: list[tuple[Any, HeadsConfig]] = []  # (encoder, its rule); Any: no import circle
    for m in module.modules():
        heads = getattr(m, "routing", None)
        if isinstance(heads, HeadsConfig) and heads.dynamic and heads.rule == "batch":
            switched.append((m, heads))
    for m, heads in switched:
        m.routing = dataclasses.replace(heads, rule="sentence")
    try:
        yield len(switched)
    finally:
        for m, heads in switched:
            m.routing = heads


def route_name(heads: int) -> str:
    return f"h{heads}"


class RoutedAttention(nn.Module):
    """One or two `Route`s; the decision per sequence arrives in `large` (see `choose_large`)."""

    def __init__(
        self,
        hidden: int,
        heads: HeadsConfig,
        make_core: Callable[[int], AttentionCore],
        dropout: float,
    ) -> None:
        super().__init__()
        self.small, self.large = heads.small, heads.large
        counts = sorted({heads.small, heads.large})
        self.routes = nn.ModuleDict(
            {route_name(h): Route(hidden, h, make_core(h), dropout) for h in counts}
        )

    @property
    def supports_query_subset(self) -> bool:
        """Whether `ctx.queries` may be used: every route's core allows a subset of queries."""
        return all(r.core.supports_query_subset for r in self.routes.values())  # type: ignore[union-attr]

    def route(self, heads: int) -> Route:
        return self.routes[route_name(heads)]  # type: ignore[return-value]

    def forward(self, x: torch.Tensor, ctx: AttentionContext, large: torch.Tensor) -> torch.Tensor:
        if self.small == self.large:
            return self.route(self.small)(x, ctx)
        n_large = int(large.sum())
        if n_large == large.numel():
            return self.route(self.large)(x, ctx)
        if n_large == 0:
            return self.route(self.small)(x, ctx)
        # Mixed batch (sentence rule): each sub-batch goes through its own route only.
        idx_l = large.nonzero().squeeze(1)
        idx_s = (~large).nonzero().squeeze(1)
        y_l = _run_trimmed(self.route(self.large), x.index_select(0, idx_l), ctx.select(idx_l))
        y_s = _run_trimmed(self.route(self.small), x.index_select(0, idx_s), ctx.select(idx_s))
        order = torch.cat([idx_l, idx_s])
        return torch.cat([y_l, y_s]).index_select(0, torch.argsort(order))


def _run_trimmed(route: Route, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
    """Run a sub-batch cut to its own longest real length (short sequences skip the padding).
    Query positions (`ctx.queries`) are real tokens, so they survive the cut."""
    n = int(ctx.lengths.max())
    if n == x.shape[1]:
        return route(x, ctx)
    sub = dataclasses.replace(ctx, attention_mask=ctx.attention_mask[:, :n])  # keeps memory
    y = route(x[:, :n], sub)
    if ctx.queries is not None:
        return y
    return torch.nn.functional.pad(y, (0, 0, 0, x.shape[1] - n))
