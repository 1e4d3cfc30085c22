"""GEMFormer's two passes (Sagirova & Burtsev 2023; MODELS.md section 6).

First pass: `token_entropy` runs a masked LM over a document segment by segment (with the
recurrence memory when the model has it) and gives each token the entropy (nats) of its
predicted distribution at its own, unmasked position; `keep_low_entropy` keeps the tokens
below the threshold in document order up to a budget (`select_memory` does both).

Second pass: `encode_with_memory` encodes each segment as
`[CLS] (prefix [SEP]) memory [SEP] segment` and pools the segment vectors (`.sentence`) and
keeps every token's state (`.hidden`). A prefix (a title, a question) enters both passes as
`[CLS] prefix [SEP] segment`, with token type 0 for [CLS], prefix and memory and 1 for the
segment.

The masked LM is anything with `.encoder` and `.mlm_logits(hidden)`: the pretrained model
(`AlbertForPretraining`), or the encoder being fine-tuned with the MLM head kept beside it
(`memory_reader.Selector`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import torch

from tibnlp.models.encoder import Encoder, EncoderOutput
from tibnlp.models.long_documents.windows import LongOutput, Segment, segments, weight_dtype
from tibnlp.models.segment_memory import SegmentMemory
from tibnlp.text.special import CLS_ID, CONTROL_IDS, PAD_ID, SEP_ID

Prefixes = Sequence[Sequence[int]] | None  # per document: the prefix ids, without [CLS]/[SEP]


class MaskedLM(Protocol):
    """What the first pass reads: an encoder and the MLM head over its states."""

    @property
    def encoder(self) -> Encoder: ...

    def mlm_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...


def _pack(
    parts: list[list[tuple[list[int], int]]], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of (ids, token type) pieces -> right-padded ids, mask, token types."""
    rows = [[(i, t) for ids, t in row for i in ids] for row in parts]
    n = max(len(r) for r in rows)
    ids = torch.full((len(rows), n), PAD_ID, dtype=torch.long)
    types = torch.zeros_like(ids)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = torch.tensor([i for i, _ in r], dtype=torch.long)
        types[b, : len(r)] = torch.tensor([t for _, t in r], dtype=torch.long)
    mask = (torch.arange(n)[None, :] < torch.tensor([len(r) for r in rows])[:, None]).long()
    return ids.to(device), mask.to(device), types.to(device)


def read_with_heads(
    encoder: Encoder,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    segment_len: int,
    head_of: Callable[[int], list[int]],
    recurrent: bool,
) -> Iterator[tuple[Segment, EncoderOutput, list[int], torch.Tensor]]:
    """Encode every segment as `head_of(document) + segment content` (head type 0; content
    type 1 after a head `[CLS] ... [SEP]`, type 0 after a lone `[CLS]` as in pretraining), in
    order; with `recurrent` (and a recurrence model) each segment gets the memory of the ones
    before. Yields the segment, its output, where each row's content starts, and
    the attention mask of the packed rows.
    Raises ValueError when a row would exceed `model.max_len`."""
    memory: SegmentMemory | None = None
    rows_prev = torch.arange(input_ids.shape[0], device=input_ids.device)
    carry = recurrent and encoder.cfg.recurrence.enabled
    for seg in segments(input_ids, attention_mask, segment_len):
        parts, starts = [], []
        for r, row in enumerate(seg.rows.tolist()):
            head = head_of(row)
            body = seg.input_ids[r, 1:][seg.attention_mask[r, 1:].bool()].tolist()
            parts.append([(head, 0), (body, 1 if len(head) > 1 else 0)])
            starts.append(len(head))
        ids, mask, types = _pack(parts, input_ids.device)
        if ids.shape[1] > encoder.cfg.max_len:
            raise ValueError(
                f"[CLS] prefix memory segment is {ids.shape[1]} tokens > model.max_len "
                f"{encoder.cfg.max_len}: lower the memory budget or segment_len"
            )
        if memory is not None and seg.rows.numel() < rows_prev.numel():
            memory = memory.select(torch.searchsorted(rows_prev, seg.rows))
        out = encoder(ids, mask, types, memory=memory if carry else None)
        yield seg, out, starts, mask
        memory, rows_prev = (out.memory if carry else None), seg.rows


def _head(prefixes: Prefixes, row: int) -> list[int]:
    return [CLS_ID, *prefixes[row], SEP_ID] if prefixes else [CLS_ID]


@torch.no_grad()
def token_entropy(
    model: MaskedLM,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    segment_len: int,
    prefixes: Prefixes = None,
) -> torch.Tensor:
    """[B, T] float: MLM predictive entropy (nats) of every token; +inf at padding/[CLS].

    Each segment is read as `[CLS] (prefix [SEP]) segment`; without a prefix that is exactly
    the segmenting rule of `windows.segments`."""
    out = torch.full(input_ids.shape, float("inf"), device=input_ids.device)
    for seg, enc, starts, _ in read_with_heads(
        model.encoder,
        input_ids,
        attention_mask,
        segment_len,
        lambda row: _head(prefixes, row),
        recurrent=True,
    ):
        logp = torch.log_softmax(model.mlm_logits(enc.hidden).float(), dim=-1)
        h = -(logp.exp() * logp).sum(-1)  # [b, n]
        for r, row in enumerate(seg.rows.tolist()):
            pos = seg.positions[1:][seg.attention_mask[r, 1:].bool()]
            out[row, pos] = h[r, starts[r] : starts[r] + pos.numel()]
    return out


@dataclass
class GlobalMemory:
    """The kept tokens per document, in document order, right-padded.

    `ids`, `positions` [B, M] long (positions index the input; padding -1), `mask` [B, M]
    bool, `size` [B] long (kept tokens), `share` [B] float (kept / content tokens).
    """

    ids: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor
    size: torch.Tensor
    share: torch.Tensor

    def stats(self) -> dict[str, float]:
        """Loggable figures (e.g. to MLflow): memory size and its share of the document."""
        return memory_stats(self.size.float(), self.share.float())


def memory_stats(sizes: torch.Tensor, shares: torch.Tensor) -> dict[str, float]:
    """Mean and largest memory size, mean share of the document kept."""
    return {
        "memory_size_mean": float(sizes.mean()),
        "memory_size_max": float(sizes.max()),
        "memory_share_mean": float(shares.mean()),
    }


def keep_low_entropy(
    input_ids: torch.Tensor,
    entropy: torch.Tensor,
    threshold: float,
    budget: int,
    special_ids: frozenset[int] = CONTROL_IDS,
) -> GlobalMemory:
    """Tokens with entropy < threshold, first `budget` in document order, specials excluded."""
    dev = input_ids.device
    special = torch.isin(input_ids, torch.tensor(sorted(special_ids), device=dev))
    content = torch.isfinite(entropy) & ~special
    keep = content & (entropy < threshold)
    keep = keep & (keep.long().cumsum(1) <= budget)
    size = keep.sum(1)
    width = max(int(size.max()) if size.numel() else 0, 1)
    positions = torch.full((input_ids.shape[0], width), -1, dtype=torch.long, device=dev)
    ids = torch.full_like(positions, PAD_ID)
    for b in range(input_ids.shape[0]):
        pos = keep[b].nonzero().squeeze(1)
        positions[b, : pos.numel()] = pos
        ids[b, : pos.numel()] = input_ids[b, pos]
    share = size.float() / content.sum(1).clamp(min=1).float()
    return GlobalMemory(ids, positions, positions >= 0, size, share)


def select_memory(
    model: MaskedLM,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    segment_len: int,
    threshold: float = 0.3,
    budget: int = 128,
    prefixes: Prefixes = None,
) -> GlobalMemory:
    """GEMFormer's first pass: the document's confidently predicted tokens as global memory."""
    entropy = token_entropy(model, input_ids, attention_mask, segment_len, prefixes)
    return keep_low_entropy(input_ids, entropy, threshold, budget)


def encode_with_memory(
    encoder: Encoder,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    memory: GlobalMemory,
    segment_len: int,
    prefixes: Prefixes = None,
    pool: Literal["mean", "max"] = "mean",
) -> LongOutput:
    """Encode each segment as `[CLS] (prefix [SEP]) memory [SEP] segment` and pool.

    `segment_len` counts the document positions per segment as in `segments` ([CLS] +
    content). Prefix (title/question) and memory have token type 0, the segment type 1.
    `sentence`: the segments' sentence vectors pooled (`mean` or `max`); `hidden` [B, T, D]:
    each content token's state from its segment, position 0 the pooled [CLS] states. Raises
    ValueError when a row would exceed `model.max_len`.
    """
    b, t = input_ids.shape
    dev = input_ids.device
    hidden = torch.zeros(b, t, encoder.cfg.hidden_size, device=dev, dtype=weight_dtype(encoder))
    vecs: list[list[torch.Tensor]] = [[] for _ in range(b)]
    cls: list[list[torch.Tensor]] = [[] for _ in range(b)]
    kept = [memory.ids[row, memory.mask[row]].tolist() for row in range(b)]

    def head_of(row: int) -> list[int]:
        return [*_head(prefixes, row), *kept[row], SEP_ID]

    for seg, out, starts, mask in read_with_heads(
        encoder, input_ids, attention_mask, segment_len, head_of, recurrent=False
    ):
        sent = encoder.sentence_vector(out, mask)
        for r, row in enumerate(seg.rows.tolist()):
            vecs[row].append(sent[r])
            cls[row].append(out.hidden[r, 0])
            pos = seg.positions[1:][seg.attention_mask[r, 1:].bool()]
            h = out.hidden[r, starts[r] : starts[r] + pos.numel()].to(hidden.dtype)
            hidden = hidden.index_put((torch.full_like(pos, row), pos), h)
    reduce = (lambda v: v.mean(0)) if pool == "mean" else (lambda v: v.amax(0))
    sentence = torch.stack([reduce(torch.stack(v)) for v in vecs])
    first = torch.stack([reduce(torch.stack(v)) for v in cls]).to(hidden.dtype)
    hidden = torch.cat([first[:, None], hidden[:, 1:]], dim=1)
    return LongOutput(hidden, sentence, torch.tensor([len(v) for v in vecs], device=dev))
