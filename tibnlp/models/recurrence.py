"""Segment recurrence (Transformer-XL; MODELS.md section 4): long documents read segment by
segment, each layer attending to the previous segment's gradient-stopped states.

Segmenting rule (tibnlp): a tokenized document `[CLS] t_1 ... t_T` (right-padded) is cut into
segments of `segment_len` positions: the document's first token ([CLS]) is repeated at the
head of every segment, followed by the next `segment_len - 1` content tokens. Every segment
therefore has a [CLS] whose state sees the segment and, through the memory, the ones before:
the sentence vector of the document is that of its last non-empty segment.

- `SegmentMemory`: what `Encoder.forward(..., memory=)` takes and `EncoderOutput.memory` gives.
- `encode_long(encoder, ids, mask, segment_len)`: classification of long documents;
  `LongDocumentEncoder(encoder, segment_len)` wraps it as an encoder module for heads.
- `mlm_over_segments(model, ids, mask, mlm_labels, segment_len)`: pretraining MLM over
  consecutive segments of documents (no SOP: the pair task does not apply to one stream).
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from tibnlp.models.encoder import Encoder, EncoderOutput
    from tibnlp.models.pretraining import AlbertForPretraining

IGNORE = -100


@dataclass
class SegmentMemory:
    """Per layer l, `states[l]` [B, M, D]: the inputs of layer l over the last M positions
    read (detached); `mask` [B, M] bool marks which of them were real tokens.

    Relative distances count positions of the concatenation [memory; segment], padding
    included, so a row's padding must only ever follow its document's last token: true for
    `segments` (a document that ended has no further segment), not for arbitrary batches.
    """

    states: list[torch.Tensor]
    mask: torch.Tensor

    def select(self, index: torch.Tensor) -> SegmentMemory:
        """The memory of the documents (rows) `index`."""
        return SegmentMemory([s.index_select(0, index) for s in self.states], self.mask[index])


def next_memory(
    previous: SegmentMemory | None, states: list[torch.Tensor], mask: torch.Tensor, mem_len: int
) -> SegmentMemory:
    """Append this segment's layer inputs to the memory, keep the last `mem_len`, stop grads."""
    if previous is not None:
        states = [torch.cat([p, s], dim=1) for p, s in zip(previous.states, states, strict=True)]
        mask = torch.cat([previous.mask, mask], dim=1)
    return SegmentMemory([s[:, -mem_len:].detach() for s in states], mask[:, -mem_len:])


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
    """The segments of `[CLS] + content` documents (see the module rule), first to last."""
    if segment_len < 2:
        raise ValueError("segment_len must be >= 2 ([CLS] plus at least one token)")
    b, t = input_ids.shape
    step = segment_len - 1
    content_ids, content_mask = input_ids[:, 1:], attention_mask[:, 1:]
    n_seg = max(1, -(-(t - 1) // step))
    for k in range(n_seg):
        ids = content_ids[:, k * step : (k + 1) * step]
        m = content_mask[:, k * step : (k + 1) * step]
        rows = torch.arange(b) if k == 0 else m.bool().any(1).nonzero().squeeze(1)
        if rows.numel() == 0:
            return
        pos = torch.cat([torch.tensor([-1]), torch.arange(ids.shape[1]) + 1 + k * step])
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
    rows_prev = torch.arange(input_ids.shape[0])
    for seg in segments(input_ids, attention_mask, segment_len):
        if memory is not None and seg.rows.numel() < rows_prev.numel():  # some documents ended
            memory = memory.select(torch.searchsorted(rows_prev, seg.rows))
        out = encoder(seg.input_ids, seg.attention_mask, memory=memory)
        yield seg, out
        memory, rows_prev = out.memory, seg.rows


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
    hidden = torch.zeros(b, t, encoder.cfg.hidden_size)
    sentence = torch.zeros(b, encoder.sentence_dim)
    count = torch.zeros(b, dtype=torch.long)
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
    `encoder` as its only submodule; subclasses say how a batch is read (`read`)."""

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


class LongDocumentEncoder(WindowReader):
    """`encoder` reading documents segment by segment (`encode_long`)."""

    def __init__(self, encoder: Encoder, segment_len: int) -> None:
        super().__init__(encoder)
        self.segment_len = segment_len

    def read(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> LongOutput:
        return encode_long(self.encoder, input_ids, attention_mask, self.segment_len)


def mlm_logits(model: AlbertForPretraining, hidden: torch.Tensor) -> torch.Tensor:
    """The MLM head (decoder tied to the word embedding) on hidden states [..., D]."""
    z = model.mlm_norm(F.gelu(model.mlm_dense(hidden)))
    return F.linear(z, model.encoder.embeddings.word.weight, model.mlm_bias)


def mlm_over_segments(
    model: AlbertForPretraining,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    mlm_labels: torch.Tensor,
    segment_len: int,
) -> dict[str, torch.Tensor]:
    """MLM loss over all segments of a batch of documents, memory carried between segments.

    Same masking as ordinary pretraining (`mlm_labels` [B, T], -100 where not predicted; the
    [CLS] at position 0 must be -100). Returns `loss` (= `mask_loss`, mean over every masked
    token of every segment; backward once), `mask_loss`, `mask_accuracy` (detached),
    `segments`. Memory is gradient-stopped, so the graph of segment k never reaches back to
    segment k - 1; the graphs of all segments are held until backward.
    """
    total = input_ids.new_zeros((), dtype=torch.float)
    correct = input_ids.new_zeros((), dtype=torch.float)
    count, n_seg = 0, 0
    anchor = None  # keeps a graph when no token of the batch is masked
    for seg, out in run_segments(model.encoder, input_ids, attention_mask, segment_len):
        cols = seg.positions.clamp(min=0)
        labels = mlm_labels[seg.rows][:, cols].masked_fill(seg.positions[None, :] < 0, IGNORE)
        sel = labels != IGNORE
        anchor = out.hidden.sum() * 0.0 if anchor is None else anchor
        if bool(sel.any()):
            logits = mlm_logits(model, out.hidden[sel])
            targets = labels[sel]
            total = total + F.cross_entropy(logits, targets, reduction="sum")
            correct = correct + (logits.argmax(-1) == targets).sum()
            count += int(targets.numel())
        n_seg += 1
    loss = total / count if count else anchor if anchor is not None else total
    return {
        "loss": loss,
        "mask_loss": loss.detach(),
        "mask_accuracy": (correct / max(count, 1)).detach(),
        "segments": torch.tensor(n_seg),
    }
