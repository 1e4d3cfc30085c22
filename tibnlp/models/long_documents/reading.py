"""How a classifier reads documents longer than its window, recorded with the classifier
(`classifier.yaml`, key `reading`) so that `tibnlp predict` reads as training did.

- `truncate`: the first `window` tokens only (the usual fine-tuning).
- `segments`: windows read in order (`windows.SegmentReader`; recurrence when the model has it).
- `memory`: GEMFormer (`memory_reader.MemoryReader`), selection `finetuned` or `frozen`.

`document_max_len` is how many tokens of a document are read (the window for `truncate`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from torch import nn

from tibnlp.config.core import check
from tibnlp.config.finetune import GlobalMemoryConfig
from tibnlp.models.encoder import Encoder
from tibnlp.models.long_documents.memory_reader import MemoryReader
from tibnlp.models.long_documents.windows import SegmentReader, WindowReader


@dataclass
class Reading:
    mode: Literal["truncate", "segments", "memory"] = "truncate"
    window: int = 0  # tokens per window incl. [CLS]; 0: the classifier's max_len
    document_max_len: int = 0  # tokens read per document; 0: the window
    selection: Literal["finetuned", "frozen"] = "finetuned"  # memory only
    memory: GlobalMemoryConfig = field(default_factory=GlobalMemoryConfig)  # memory only
    prefix: bool = False  # memory only: inputs are `[CLS] prefix [SEP] document [SEP]`

    def validate(self, prefix: str) -> None:
        check(self.window >= 0, f"{prefix}.window", "must be >= 0")
        check(  # a window is [CLS] and at least one token of the document
            self.mode == "truncate" or self.window != 1,
            f"{prefix}.window",
            "must be 0 (the classifier's max_len) or >= 2 ([CLS] and a token)",
        )
        check(self.document_max_len >= 0, f"{prefix}.document_max_len", "must be >= 0")

    def positions(self, window: int) -> int:
        """Positions one encoder row takes: the window, or with memory `[CLS]`, the memory
        budget, `[SEP]` and the window's tokens after its own `[CLS]`."""
        size = self.window or window
        if self.mode != "memory":
            return size
        return 1 + self.memory.budget + 1 + (size - 1)

    def read_length(self, window: int) -> int:
        """Tokens of each text encoded: the window, or the long-document cap (below one
        window too: a document is read up to `document_max_len` tokens, as set)."""
        if self.mode == "truncate":
            return window
        return self.document_max_len or window


def build_reader(encoder: Encoder, reading: Reading, window: int) -> nn.Module:
    """`encoder` itself for `truncate`, else the reader around it (`window`: the classifier's
    max_len when `reading.window` is 0)."""
    size = reading.window or window
    if reading.mode == "segments":
        return SegmentReader(encoder, size)
    if reading.mode == "memory":
        gm = reading.memory
        return MemoryReader(
            encoder, size, gm.threshold, gm.budget, reading.selection, reading.prefix
        )
    return encoder


def inner_encoder(module: nn.Module) -> nn.Module:
    """The encoder inside a reader (or the module itself)."""
    return module.encoder if isinstance(module, WindowReader) else module
