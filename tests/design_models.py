"""Tiny configs shared by the tests of the attention designs (sections 4-6 of MODELS.md)."""

from __future__ import annotations

import torch

from tibnlp.config.model import HeadsConfig, ModelConfig
from tibnlp.models import Encoder, EncoderOutput


def tiny(**kw: object) -> ModelConfig:
    """A 2-layer, D=32, 4-head model without dropout, initialised wide enough that
    attention is far from uniform (so perturbation tests see real differences)."""
    base: dict[str, object] = dict(
        vocab_size=40,
        embedding_size=8,
        hidden_size=32,
        num_layers=2,
        ffn_size=48,
        max_len=32,
        heads=HeadsConfig(small=4, large=4),
        dropout=0.0,
        attention_dropout=0.0,
        initializer_range=0.2,
    )
    base.update(kw)
    return ModelConfig(**base)  # type: ignore[arg-type]


def dynamic_routes_pad_cleanly(cfg: ModelConfig) -> EncoderOutput:
    """Sentence-rule heads (2, 4), threshold 4, on a batch of lengths 7 and 3: each sequence
    takes its route, and the short one equals itself run alone (padding changes nothing)."""
    torch.manual_seed(0)
    enc = Encoder(cfg).eval()
    ids = torch.randint(5, 40, (2, 7))
    mask = torch.tensor([[1] * 7, [1] * 3 + [0] * 4])
    out = enc(ids, mask)
    assert out.large.tolist() == [True, False]
    alone = enc(ids[1:, :3], mask[1:, :3]).hidden
    torch.testing.assert_close(out.hidden[1, :3], alone[0], rtol=1e-5, atol=1e-5)
    assert torch.isfinite(out.hidden).all() and out.hidden[1, 3:].abs().max() == 0
    return out


SENTENCE_RULE = HeadsConfig(small=2, large=4, threshold=4, rule="sentence")
