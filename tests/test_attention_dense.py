"""Dense core and the attention registry."""

from __future__ import annotations

import math

import pytest
import torch

from tibnlp.config.model import ModelConfig, ScalesConfig
from tibnlp.models.attention import (
    CORES,
    AttentionContext,
    DenseCore,
    MultiScaleCore,
    build_attention,
    core_name,
    register_core,
)


def test_dense_core_equals_masked_softmax() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, 4, 7, 5, dtype=torch.float64).unbind(0)
    lengths = torch.tensor([7, 4])
    mask = torch.arange(7)[None, :] < lengths[:, None]
    out = DenseCore(4).eval()(q, k, v, AttentionContext(mask, lengths))
    scores = q @ k.transpose(-1, -2) / math.sqrt(5)
    ref = torch.softmax(scores.masked_fill(~mask[:, None, None, :], float("-inf")), -1) @ v
    torch.testing.assert_close(out, ref)
    # Without padding the unmasked fused path is taken and agrees too.
    full = DenseCore(4).eval()(q[:1], k[:1], v[:1], AttentionContext(mask[:1], lengths[:1]))
    torch.testing.assert_close(full, ref[:1])


def test_registry_selects_core_by_config() -> None:
    assert {"dense", "multiscale"} <= set(CORES)
    assert core_name(ModelConfig()) == "dense"
    ms = ModelConfig(scales=ScalesConfig(windows=["1", "N/4"]))
    assert core_name(ms) == "multiscale"
    assert isinstance(build_attention(ms).route(12).core, MultiScaleCore)
    with pytest.raises(ValueError, match="already registered"):
        register_core("dense")(lambda cfg, h: DenseCore(h))


def test_relative_position_selects_its_core() -> None:
    assert core_name(ModelConfig(position="relative")) == "relative"
