"""Models: pure `nn.Module`s built from `ModelConfig` (no training, tracking or CLI imports)."""

from tibnlp.models.encoder import Encoder, EncoderOutput
from tibnlp.models.io import (
    build_encoder,
    load_encoder,
    load_pretrained,
    read_extra,
    save_pretrained,
)
from tibnlp.models.pretraining import AlbertForPretraining

__all__ = [
    "AlbertForPretraining",
    "Encoder",
    "EncoderOutput",
    "build_encoder",
    "load_encoder",
    "load_pretrained",
    "read_extra",
    "save_pretrained",
]
