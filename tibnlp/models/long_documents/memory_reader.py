"""GEMFormer as a drop-in encoder for any classification head (`MemoryReader`).

The first pass needs a masked LM (`Selector`). Two choices (`finetune.memory_selection`):

- `finetuned` (the paper's GEMFormer): the encoder being fine-tuned with the pretrained MLM
  head kept beside it (its weights frozen), so the memory follows the
  model as it learns the task. In training the selection is a snapshot refreshed at each
  epoch start (`refresh`, then `fill` over the training documents, as the paper does); in
  evaluation it is computed with the current weights, batch by batch.
- `frozen` (the paper's "no fine-tune" ablation): the pretrained encoder and MLM head, a
  frozen copy, selecting once per document (cached).

Either way the selector is a submodule, saved with the classifier, so `tibnlp predict`
rebuilds the same reading from the classifier directory alone. `frozen_parameters` lists the
weights that are never trained (the classifier keeps them frozen when it unfreezes the rest).

A prefix (`prefix=True`): each input row is `[CLS] prefix [SEP] document [SEP]` (a text
pair); the prefix is split off at the first [SEP] and enters both passes as
`[CLS] prefix [SEP] ...` (see `gemformer`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from tibnlp.data.collate import pad_batch
from tibnlp.models.encoder import Encoder
from tibnlp.models.long_documents.gemformer import (
    GlobalMemory,
    MaskedLM,
    encode_with_memory,
    memory_stats,
    select_memory,
)
from tibnlp.models.long_documents.windows import LongOutput, WindowReader
from tibnlp.models.pretraining import AlbertForPretraining, mlm_head_logits
from tibnlp.text.special import CLS_ID, SEP_ID

Selection = Literal["finetuned", "frozen"]
Key = tuple[int, ...]


class Selector(nn.Module):
    """The first pass's masked LM: the pretrained MLM head (dense, norm, bias) over the states
    of an encoder, its decoder tied to that encoder's word embedding.

    `finetuned`: the encoder is the reader's, the one being fine-tuned (held outside this
    module, so it is saved once). `frozen`: a copy of the pretrained encoder of its own.
    Either way the selector's own weights are never trained."""

    def __init__(self, encoder: Encoder, selection: Selection) -> None:
        super().__init__()
        cfg = encoder.cfg
        self.selection = selection
        self._reader_encoder = (encoder,)
        self.frozen_encoder = Encoder(cfg) if selection == "frozen" else None
        self.mlm_dense = nn.Linear(cfg.hidden_size, cfg.embedding_size)
        self.mlm_norm = nn.LayerNorm(cfg.embedding_size, eps=cfg.layer_norm_eps)
        self.mlm_bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    @property
    def encoder(self) -> Encoder:
        return self.frozen_encoder or self._reader_encoder[0]

    def mlm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        word = self.encoder.embeddings.word.weight
        return mlm_head_logits(self.mlm_dense, self.mlm_norm, self.mlm_bias, word, hidden)

    def load_from(self, mlm: AlbertForPretraining) -> None:
        """The pretrained model's MLM head (and, `frozen`, its encoder)."""
        self.mlm_dense.load_state_dict(mlm.mlm_dense.state_dict())
        self.mlm_norm.load_state_dict(mlm.mlm_norm.state_dict())
        with torch.no_grad():
            self.mlm_bias.copy_(mlm.mlm_bias)
        if self.frozen_encoder is not None:
            self.frozen_encoder.load_state_dict(mlm.encoder.state_dict())


@dataclass
class _Kept:
    ids: list[int]
    positions: list[int]
    share: float


class MemoryReader(WindowReader):
    """`encoder` reading `[CLS] (prefix [SEP]) memory [SEP] window` per window."""

    def __init__(
        self,
        encoder: Encoder,
        segment_len: int,
        threshold: float = 0.3,
        budget: int = 128,
        selection: Selection = "finetuned",
        prefix: bool = False,
    ) -> None:
        super().__init__(encoder)
        self.segment_len, self.threshold, self.budget = segment_len, threshold, budget
        self.selection, self.prefix = selection, prefix
        self.selector = Selector(encoder, selection)
        for p in self.selector.parameters():
            p.requires_grad_(False)
        self.kept: dict[Key, _Kept] = {}
        self.last_stats: dict[str, float] = {}

    def frozen_parameters(self) -> Iterator[nn.Parameter]:
        """Weights never trained: the selector's (the MLM head, or the frozen model)."""
        return self.selector.parameters()

    def load_mlm(self, mlm: AlbertForPretraining) -> None:
        """Take the selector's weights from the pretrained model (before fine-tuning)."""
        self.selector.load_from(mlm)
        self.kept.clear()

    def train(self, mode: bool = True) -> MemoryReader:
        super().train(mode)
        self.selector.eval()  # a frozen model never drops out
        return self

    def refresh(self) -> None:
        """Forget the selection made with older weights (`finetuned`); `frozen` keeps it."""
        if self.selection == "finetuned":
            self.kept.clear()

    @contextlib.contextmanager
    def _selecting(self) -> Iterator[MaskedLM]:
        """The masked LM of the first pass, in eval mode (no dropout) while it selects."""
        lm = self.selector
        was = lm.encoder.training
        lm.encoder.eval()
        try:
            yield lm
        finally:
            lm.encoder.train(was)

    def split(self, row: Sequence[int]) -> tuple[list[int], list[int]]:
        """One real row -> (prefix ids, document ids `[CLS] ...`): with `prefix`, the row is
        `[CLS] prefix [SEP] document [SEP]`."""
        row = list(row)
        if not self.prefix or SEP_ID not in row:
            return [], row
        cut = row.index(SEP_ID)
        return row[1:cut], [CLS_ID, *row[cut + 1 :]]

    def _select(self, rows: Sequence[Sequence[int]], device: torch.device) -> list[_Kept]:
        parts = [self.split(r) for r in rows]
        ids, mask = pad_batch([d for _, d in parts])
        prefixes = [p for p, _ in parts] if self.prefix else None
        with self._selecting() as lm:
            mem = select_memory(
                lm,
                ids.to(device),
                mask.to(device),
                self.segment_len,
                self.threshold,
                self.budget,
                prefixes,
            )
        return [
            _Kept(
                mem.ids[b, mem.mask[b]].tolist(),
                mem.positions[b, mem.mask[b]].tolist(),
                float(mem.share[b]),
            )
            for b in range(len(rows))
        ]

    def fill(self, docs: Sequence[Sequence[int]], batch_size: int) -> None:
        """Select the memory of every document not yet selected, `batch_size` at a time."""
        device = self.encoder.embeddings.word.weight.device
        todo = list(dict.fromkeys(tuple(d) for d in docs if tuple(d) not in self.kept))
        for start in range(0, len(todo), batch_size):
            chunk = todo[start : start + batch_size]
            self.kept.update(zip(chunk, self._select(chunk, device), strict=True))

    def stats(self, docs: Sequence[Sequence[int]]) -> dict[str, float]:
        rows = [self.kept[tuple(d)] for d in docs]
        sizes = torch.tensor([len(r.ids) for r in rows], dtype=torch.float)
        return memory_stats(sizes, torch.tensor([r.share for r in rows]))

    def memory(self, docs: Sequence[Sequence[int]], device: torch.device) -> GlobalMemory:
        """The memory of each document (real ids). Training: the epoch's snapshot (filled
        as needed). Evaluation: `finetuned` selects with the current weights; `frozen` uses
        the snapshot where it has the document (the same selection), else selects without
        storing (a long `predict` does not grow the snapshot)."""
        if self.training:
            self.fill(docs, len(docs))
            rows = [self.kept[tuple(d)] for d in docs]
        elif self.selection == "finetuned":
            rows = self._select(docs, device)
        else:
            todo = [d for d in docs if tuple(d) not in self.kept]
            fresh = dict(
                zip(map(tuple, todo), self._select(todo, device) if todo else [], strict=True)
            )
            rows = [self.kept.get(tuple(d)) or fresh[tuple(d)] for d in docs]
        width = max(1, max(len(r.ids) for r in rows))
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        positions = torch.full((len(rows), width), -1, dtype=torch.long)
        for b, r in enumerate(rows):
            ids[b, : len(r.ids)] = torch.tensor(r.ids, dtype=torch.long)
            positions[b, : len(r.positions)] = torch.tensor(r.positions, dtype=torch.long)
        size = (positions >= 0).sum(1)
        share = torch.tensor([r.share for r in rows])
        ids, positions = ids.to(device), positions.to(device)
        return GlobalMemory(ids, positions, positions >= 0, size.to(device), share.to(device))

    def read(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> LongOutput:
        rows = [r[m.bool()].tolist() for r, m in zip(input_ids, attention_mask, strict=True)]
        mem = self.memory(rows, input_ids.device)
        self.last_stats = mem.stats()
        parts = [self.split(r) for r in rows]
        ids, mask = pad_batch([d for _, d in parts])
        prefixes = [p for p, _ in parts] if self.prefix else None
        out = encode_with_memory(
            self.encoder,
            ids.to(input_ids.device),
            mask.to(input_ids.device),
            mem,
            self.segment_len,
            prefixes,
        )
        unsplit = all(len(d) == len(r) for r, (_, d) in zip(rows, parts, strict=True))
        if unsplit and ids.shape[1] == input_ids.shape[1]:
            return out
        # prefix rows: the document's states go back to where the document sits in the input
        hidden = out.hidden.new_zeros(*input_ids.shape, out.hidden.shape[-1])
        for b, (r, (_, d)) in enumerate(zip(rows, parts, strict=True)):
            start = len(r) - len(d)  # the prefix and its [SEP] (none when the row was not split)
            hidden[b, 0] = out.hidden[b, 0]
            hidden[b, start + 1 : start + len(d)] = out.hidden[b, 1 : len(d)]
        return LongOutput(hidden, out.sentence, out.segments)
