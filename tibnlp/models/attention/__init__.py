"""Attention designs behind one interface, selected by configuration.

A design is an `AttentionCore` factory registered under a name; `core_name(cfg)` maps a
`ModelConfig` to the registered name, and `build_attention(cfg)` wraps one core per head count
in `RoutedAttention` (fixed or dynamic heads). Relative positions register their own core
(`relative`); RPSAN's masked fusion wraps three masked routed attentions and a gate
(`FusionAttention`), selected here by `model.fusion.enabled`.
"""

from __future__ import annotations

from collections.abc import Callable

from tibnlp.config.model import ModelConfig
from tibnlp.errors import ConfigError
from tibnlp.models.attention.base import AttentionContext, AttentionCore, Route, masked_softmax
from tibnlp.models.attention.dense import DenseCore
from tibnlp.models.attention.dynamic import RoutedAttention, choose_large, numeric_threshold
from tibnlp.models.attention.masked import FusionAttention, MaskedCore
from tibnlp.models.attention.multiscale import MultiScaleCore, head_distribution
from tibnlp.models.attention.relative import RelativeCore

CoreFactory = Callable[[ModelConfig, int], AttentionCore]

CORES: dict[str, CoreFactory] = {}


def register_core(name: str) -> Callable[[CoreFactory], CoreFactory]:
    """Register a factory `(cfg, heads) -> AttentionCore` under `name`."""

    def deco(factory: CoreFactory) -> CoreFactory:
        if name in CORES:
            raise ValueError(f"attention core {name!r} is already registered")
        CORES[name] = factory
        return factory

    return deco


@register_core("dense")
def _dense(cfg: ModelConfig, heads: int) -> AttentionCore:
    return DenseCore(heads, cfg.attention_dropout)


@register_core("multiscale")
def _multiscale(cfg: ModelConfig, heads: int) -> AttentionCore:
    s = cfg.scales
    return MultiScaleCore(heads, s.windows, s.alpha, cfg.num_layers, cfg.attention_dropout)


@register_core("relative")
def _relative(cfg: ModelConfig, heads: int) -> AttentionCore:
    return RelativeCore(heads, cfg.hidden_size, cfg.attention_dropout)


def core_name(cfg: ModelConfig) -> str:
    """Which registered core a config selects ('masked_fusion': three `MaskedCore` branches)."""
    if cfg.fusion.enabled:
        return "masked_fusion"
    if cfg.position == "relative":
        return "relative"
    if cfg.position != "absolute":
        raise ConfigError(f"config key 'model.position': {cfg.position!r} is not known")
    return "multiscale" if cfg.scales.enabled else "dense"


def build_attention(cfg: ModelConfig) -> RoutedAttention | FusionAttention:
    """The attention module of one (shared) layer for `cfg`."""
    name = core_name(cfg)
    if cfg.heads.dynamic:
        numeric_threshold(cfg.heads)
    if name == "masked_fusion":
        r, p = cfg.fusion.radius, cfg.attention_dropout
        return FusionAttention(
            cfg.hidden_size,
            lambda kind: RoutedAttention(
                cfg.hidden_size, cfg.heads, lambda h: MaskedCore(h, kind, r, p), cfg.dropout
            ),
        )
    factory = CORES[name]
    return RoutedAttention(cfg.hidden_size, cfg.heads, lambda h: factory(cfg, h), cfg.dropout)


__all__ = [
    "CORES",
    "AttentionContext",
    "AttentionCore",
    "DenseCore",
    "FusionAttention",
    "MaskedCore",
    "MultiScaleCore",
    "RelativeCore",
    "Route",
    "RoutedAttention",
    "build_attention",
    "choose_large",
    "core_name",
    "head_distribution",
    "masked_softmax",
    "register_core",
]
