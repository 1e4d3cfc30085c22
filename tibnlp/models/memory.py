"""Memory tokens and uncertainty-guided global memory (MODELS.md section 6).

- `MemoryTokens` (Burtsev et al. 2020): `model.memory_tokens: k` learned [MEM] states
  prepended to every input inside the encoder; every token attends to them and they attend
  to every token; the encoder drops them from its output. They carry no position embedding,
  so the real tokens keep positions 0..n-1 and `max_len` still bounds the real input.
- GEMFormer (Sagirova & Burtsev 2023): `token_entropy` runs the pretrained MLM over a
  document segment by segment (with recurrence memory when the model has it) and gives each
  token the entropy (nats) of its predicted distribution at its own, unmasked position;
  `select_memory` keeps the tokens below the threshold in document order up to a budget;
  `encode_with_memory` encodes each segment as `[CLS] (title [SEP]) memory [SEP] segment`
  and pools the segment vectors (`.sentence`) and keeps every token's state (`.hidden`);
  `GlobalMemoryEncoder` wraps both passes as an encoder module for any head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from torch import nn

from tibnlp.models.recurrence import (
    LongOutput,
    WindowReader,
    mlm_logits,
    run_segments,
    segments,
)

if TYPE_CHECKING:
    from tibnlp.models.encoder import Encoder
    from tibnlp.models.pretraining import AlbertForPretraining

# The vocabulary's fixed special ids (tibnlp.text.vocab: [PAD] [UNK] [CLS] [SEP] [MASK]).
PAD_ID, CLS_ID, SEP_ID, MASK_ID = 0, 2, 3, 4
SPECIAL_IDS = (PAD_ID, CLS_ID, SEP_ID, MASK_ID)


class MemoryTokens(nn.Module):
    """k learned memory states of width D, prepended to the embedded input."""

    def __init__(self, count: int, hidden: int, std: float = 0.02) -> None:
        super().__init__()
        self.count = count
        self.states = nn.Parameter(torch.randn(count, hidden) * std)

    def prepend(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, n, D], [B, n] bool -> [B, k + n, D], [B, k + n] (memory slots always real)."""
        b = x.shape[0]
        mem = self.states.to(x.dtype).unsqueeze(0).expand(b, -1, -1)
        real = torch.ones(b, self.count, dtype=torch.bool, device=mask.device)
        return torch.cat([mem, x], dim=1), torch.cat([real, mask], dim=1)


@torch.no_grad()
def token_entropy(
    model: AlbertForPretraining,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    segment_len: int,
) -> torch.Tensor:
    """[B, T] float: MLM predictive entropy (nats) of every token; +inf at padding/[CLS]."""
    out = torch.full(input_ids.shape, float("inf"))
    for seg, enc in run_segments(model.encoder, input_ids, attention_mask, segment_len):
        logp = torch.log_softmax(mlm_logits(model, enc.hidden).float(), dim=-1)
        h = -(logp.exp() * logp).sum(-1)  # [b, S]
        cols = seg.positions[1:]  # skip the [CLS] copy
        real = seg.attention_mask[:, 1:].bool()
        h = h[:, 1:].masked_fill(~real, float("inf"))
        out[seg.rows[:, None], cols[None, :]] = h
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
        return {
            "memory_size_mean": float(self.size.float().mean()),
            "memory_size_max": float(self.size.max()),
            "memory_share_mean": float(self.share.mean()),
        }


def keep_low_entropy(
    input_ids: torch.Tensor,
    entropy: torch.Tensor,
    threshold: float,
    budget: int,
    special_ids: tuple[int, ...] = SPECIAL_IDS,
) -> GlobalMemory:
    """Tokens with entropy < threshold, first `budget` in document order, specials excluded."""
    special = torch.isin(input_ids, torch.tensor(special_ids))
    content = torch.isfinite(entropy) & ~special
    keep = content & (entropy < threshold)
    keep = keep & (keep.long().cumsum(1) <= budget)
    size = keep.sum(1)
    width = max(int(size.max()) if size.numel() else 0, 1)
    positions = torch.full((input_ids.shape[0], width), -1, dtype=torch.long)
    ids = torch.full_like(positions, PAD_ID)
    for b in range(input_ids.shape[0]):
        pos = keep[b].nonzero().squeeze(1)
        positions[b, : pos.numel()] = pos
        ids[b, : pos.numel()] = input_ids[b, pos]
    share = size.float() / content.sum(1).clamp(min=1).float()
    return GlobalMemory(ids, positions, positions >= 0, size, share)


def select_memory(
    model: AlbertForPretraining,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    segment_len: int,
    threshold: float = 0.3,
    budget: int = 128,
) -> GlobalMemory:
    """GEMFormer's first pass: the document's confidently predicted tokens as global memory."""
    entropy = token_entropy(model, input_ids, attention_mask, segment_len)
    return keep_low_entropy(input_ids, entropy, threshold, budget)


def _pack(parts: list[list[tuple[list[int], int]]]) -> tuple[torch.Tensor, ...]:
    """Rows of (ids, token type) pieces -> right-padded ids, mask, token types."""
    rows = [[(i, t) for ids, t in row for i in ids] for row in parts]
    n = max(len(r) for r in rows)
    ids = torch.full((len(rows), n), PAD_ID, dtype=torch.long)
    types = torch.zeros_like(ids)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = torch.tensor([i for i, _ in r])
        types[b, : len(r)] = torch.tensor([t for _, t in r])
    mask = (torch.arange(n)[None, :] < torch.tensor([len(r) for r in rows])[:, None]).long()
    return ids, mask, types


def encode_with_memory(
    encoder: Encoder,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    memory: GlobalMemory,
    segment_len: int,
    prefix_ids: list[list[int]] | None = None,
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
    hidden = torch.zeros(b, t, encoder.cfg.hidden_size)
    vecs: list[list[torch.Tensor]] = [[] for _ in range(b)]
    cls: list[list[torch.Tensor]] = [[] for _ in range(b)]
    for seg in segments(input_ids, attention_mask, segment_len):
        parts, starts = [], []
        for r, row in enumerate(seg.rows.tolist()):
            head = [CLS_ID] + ([*prefix_ids[row], SEP_ID] if prefix_ids else [])
            head += [*memory.ids[row, memory.mask[row]].tolist(), SEP_ID]
            body = seg.input_ids[r, 1:][seg.attention_mask[r, 1:].bool()].tolist()
            parts.append([(head, 0), (body, 1)])
            starts.append(len(head))
        ids, mask, types = _pack(parts)
        if ids.shape[1] > encoder.cfg.max_len:
            raise ValueError(
                f"[CLS] prefix memory segment is {ids.shape[1]} tokens > model.max_len "
                f"{encoder.cfg.max_len}: lower the memory budget or segment_len"
            )
        out = encoder(ids, mask, types)
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
    return LongOutput(hidden, sentence, torch.tensor([len(v) for v in vecs]))


class GlobalMemoryEncoder(WindowReader):
    """GEMFormer as a drop-in encoder: `forward(input_ids, attention_mask) -> LongOutput`.

    Each call runs the first pass (`select_memory`, no gradient) with `mlm`, then
    `encode_with_memory` with the trained `encoder`. `mlm` is kept outside the module tree
    (not trained, not saved with the classifier): pass the pretrained model. `last_stats`
    holds the latest batch's `GlobalMemory.stats()` for logging.
    """

    def __init__(
        self,
        encoder: Encoder,
        mlm: AlbertForPretraining,
        segment_len: int,
        threshold: float = 0.3,
        budget: int = 128,
    ) -> None:
        super().__init__(encoder)
        self._mlm = (mlm.eval(),)
        self.segment_len, self.threshold, self.budget = segment_len, threshold, budget
        self.last_stats: dict[str, float] = {}

    def read(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> LongOutput:
        mem = select_memory(
            self._mlm[0], input_ids, attention_mask, self.segment_len, self.threshold, self.budget
        )
        self.last_stats = mem.stats()
        return encode_with_memory(self.encoder, input_ids, attention_mask, mem, self.segment_len)
