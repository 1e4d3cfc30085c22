"""Segment recurrence over long documents (Transformer-XL; MODELS.md section 4).

Segmenting rule (tibnlp): a tokenized document `[CLS] t_1 ... t_T` (right-padded) is cut into
segments of `segment_len` positions: the document's first token ([CLS]) is repeated at the
head of every segment, followed by the next `segment_len - 1` content tokens. Every segment
therefore has a [CLS] whose state sees the segment and, through the memory, the ones before:
the sentence vector of the document is that of its last non-empty segment.

- `segments` / `run_segments`: the segments of a batch, and their encoding in order, each
  with the recurrence memory of the ones before (when the model has `recurrence.mem_len`).
- `encode_long(encoder, ids, mask, segment_len)`: classification of long documents;
  `SegmentReader(encoder, segment_len)` wraps it as an encoder module for heads.
- `WindowReader`: the base of every long-document reader (this one and GEMFormer's).
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from tibnlp.models.encoder import Encoder, EncoderOutput
from tibnlp.models.segment_memory import SegmentMemory
from tibnlp.text.special import SEP_ID


@dataclass
class Segment:
    """One segment of a batch of documents; `rows` are the documents with content in it."""

    index: int
    rows: torch.Tensor  # [b] long, into the batch
    input_ids: torch.Tensor  # [b, S]
    attention_mask: torch.Tensor  # [b, S] long
    positions: torch.Tensor  # [S] long: document position of each column (-1 for [CLS] copies)


def segments(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, segment_len: int
) -> Iterator[Segment]:
    """The segments of `[CLS] + content` documents (see the module rule), first to last.
    Every tensor is on the input's device."""
    if segment_len < 2:
        raise ValueError("segment_len must be >= 2 ([CLS] plus at least one token)")
    b, t = input_ids.shape
    dev = input_ids.device
    step = segment_len - 1
    content_ids, content_mask = input_ids[:, 1:], attention_mask[:, 1:]
    n_seg = max(1, -(-(t - 1) // step))
    text = content_mask.bool() & (content_ids != SEP_ID)
    for k in range(n_seg):
        ids = content_ids[:, k * step : (k + 1) * step]
        m = content_mask[:, k * step : (k + 1) * step]
        # a row is read while text remains: its closing [SEP] alone is no segment of it
        rest = text[:, k * step :].any(1)
        rows = torch.arange(b, device=dev) if k == 0 else rest.nonzero().squeeze(1)
        if rows.numel() == 0:
            return
        head = torch.tensor([-1], device=dev)
        pos = torch.cat([head, torch.arange(ids.shape[1], device=dev) + 1 + k * step])
        yield Segment(
            k,
            rows,
            torch.cat([input_ids[rows, :1], ids[rows]], dim=1),
            torch.cat([attention_mask[rows, :1], m[rows]], dim=1),
            pos,
        )


def run_segments(
    encoder: Encoder, input_ids: torch.Tensor, attention_mask: torch.Tensor, segment_len: int
) -> Iterator[tuple[Segment, EncoderOutput]]:
    """Encode the segments in order, each with the memory of the ones before (recurrence)."""
    memory: SegmentMemory | None = None
    rows_prev = torch.arange(input_ids.shape[0], device=input_ids.device)
    for seg in segments(input_ids, attention_mask, segment_len):
        if memory is not None and seg.rows.numel() < rows_prev.numel():  # some documents ended
            memory = memory.select(torch.searchsorted(rows_prev, seg.rows))
        out = encoder(seg.input_ids, seg.attention_mask, memory=memory)
        yield seg, out
        memory, rows_prev = out.memory, seg.rows


def weight_dtype(module: nn.Module) -> torch.dtype:
    """The dtype the document's states are gathered in: the weights' (16-bit when DeepSpeed's
    fp16 mode casts the whole classifier, so the head takes them; fp32 under autocast)."""
    return next(module.parameters()).dtype


@dataclass
class LongOutput:
    """A long document as one sequence, for any classification head.

    `hidden` [B, T, D]: each content token's state from the segment that read it, and at
    position 0 the document's summary [CLS] state (encode_long: the last segment's [CLS]);
    padding rows are zero. `sentence` [B, sentence_dim]; `segments` [B] long: segments read.
    """

    hidden: torch.Tensor
    sentence: torch.Tensor
    segments: torch.Tensor


def encode_long(
    encoder: Encoder, input_ids: torch.Tensor, attention_mask: torch.Tensor, segment_len: int
) -> LongOutput:
    """Read documents longer than the window segment by segment and classify from the last.

    With `model.recurrence.mem_len > 0` each segment sees the earlier ones through the memory;
    without, this is the baseline that sees only the document's last segment. `sentence` is
    the last segment's `encoder.sentence_vector`.
    """
    b, t = input_ids.shape
    dev = input_ids.device
    dtype = weight_dtype(encoder)
    hidden = torch.zeros(b, t, encoder.cfg.hidden_size, device=dev, dtype=dtype)
    sentence = torch.zeros(b, encoder.sentence_dim, device=dev, dtype=dtype)
    count = torch.zeros(b, dtype=torch.long, device=dev)
    for seg, out in run_segments(encoder, input_ids, attention_mask, segment_len):
        h = out.hidden.to(hidden.dtype)
        hidden = hidden.index_put((seg.rows[:, None], seg.positions[None, 1:]), h[:, 1:])
        hidden = hidden.index_put((seg.rows, torch.zeros_like(seg.rows)), h[:, 0])
        vec = encoder.sentence_vector(out, seg.attention_mask)
        sentence = sentence.index_copy(0, seg.rows, vec.to(sentence.dtype))
        count[seg.rows] += 1
    return LongOutput(hidden, sentence, count)


class WindowReader(nn.Module, abc.ABC):
    """A drop-in encoder for documents longer than the window: `forward(input_ids,
    attention_mask) -> LongOutput` whose `.hidden` any head consumes. It holds the trained
    `encoder`; subclasses say how a batch is read (`read`)."""

    def __init__(self, encoder: Encoder) -> None:
        super().__init__()
        self.encoder = encoder
        self.cfg = encoder.cfg

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> LongOutput:
        return self.read(input_ids, attention_mask)

    @abc.abstractmethod
    def read(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> LongOutput: ...


class SegmentReader(WindowReader):
    """`encoder` reading documents segment by segment (`encode_long`)."""

    def __init__(self, encoder: Encoder, segment_len: int) -> None:
        super().__init__(encoder)
        self.segment_len = segment_len

    def read(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> LongOutput:
        return encode_long(self.encoder, input_ids, attention_mask, self.segment_len)
