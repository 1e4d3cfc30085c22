"""Models: pure `nn.Module`s built from `ModelConfig` (no training, tracking or CLI imports).

Three layers, each importing only the ones below it (`tests/test_imports.py` checks that no
import circle forms):

- below the encoder: `attention/` (one module per design), `memory_tokens` (learned [MEM]
  states), `segment_memory` (the recurrence memory one encoder call hands to the next);
- `encoder` (ALBERT's embeddings and shared layer loop);
- above it: `pretraining` (MLM + SOP heads, `mlm_logits`), `classifier` / `classifier_io`
  (heads, save and load), and `long_documents/`, the one home for reading documents longer
  than the window (segments with recurrence, GEMFormer's global memory, the `Reading` a
  classifier records so that `tibnlp predict` reads as training did).
"""

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
