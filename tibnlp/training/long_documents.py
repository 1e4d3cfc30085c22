"""Documents longer than the window in `tibnlp finetune classify` (`finetune.long_document`).

The window is the classifier's `max_len` (`finetune.max_len`, or the task default); a document
is read up to `finetune.document_max_len` tokens. Three readings:

- `truncate`: the first `max_len` tokens only (the usual fine-tuning; the default).
- `segments`: the document is cut into windows (`tibnlp.models.recurrence.segments`: its
  [CLS] repeated at the head of each) read in order by `LongDocumentEncoder`. With a model
  pretrained with `model.recurrence.mem_len > 0` each window attends to the previous ones'
  gradient-stopped states (Transformer-XL recurrence); without, the windows are read
  independently (the no-recurrence baseline of the same reading).
- `memory` (GEMFormer): the pretrained MLM (frozen, outside the classifier) reads the document
  first; its tokens with predictive entropy below `model.global_memory.threshold` (nats, first
  `model.global_memory.budget` in document order) are prepended to every window as
  `[CLS] memory [SEP] window`. The selection depends only on the pretrained MLM, so it is
  computed once per document and cached; its size and share of the document (mean per split)
  are logged to every seed's MLflow run.

Pooling (the same heads as short texts): the CNN head convolves over every content token's
state, each taken from the window that read it, concatenated in document order (so it pools
over the whole document); the linear head uses position 0, the last window's [CLS] state
(`segments`) or the mean of the windows' [CLS] states (`memory`).

Limits: the long-document readings run on the CPU only (the mechanisms gather states into
CPU tensors; `finetune.device` must resolve to cpu, checked up front); a classifier saved
from them stores its encoder under `encoder.encoder.` and is not yet loadable by
`tibnlp predict` (which reads truncated inputs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tibnlp.config.finetune import FinetuneConfig
from tibnlp.config.model import GlobalMemoryConfig, ModelConfig
from tibnlp.data.collate import pad_batch
from tibnlp.errors import ConfigError
from tibnlp.models.encoder import Encoder
from tibnlp.models.memory import GlobalMemory, encode_with_memory, select_memory
from tibnlp.models.pretraining import AlbertForPretraining
from tibnlp.models.recurrence import LongDocumentEncoder, LongOutput, WindowReader

Key = tuple[int, ...]


def read_length(ft: FinetuneConfig, window: int) -> int:
    """How many tokens of each text are encoded: the window, or the long-document cap."""
    return window if ft.long_document == "truncate" else max(window, ft.document_max_len)


@dataclass
class _Kept:
    ids: list[int]
    positions: list[int]
    share: float


def _memory_of(rows: Sequence[_Kept]) -> GlobalMemory:
    width = max(1, max(len(r.ids) for r in rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    positions = torch.full((len(rows), width), -1, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, : len(r.ids)] = torch.tensor(r.ids, dtype=torch.long)
        positions[b, : len(r.positions)] = torch.tensor(r.positions, dtype=torch.long)
    size = (positions >= 0).sum(1)
    share = torch.tensor([r.share for r in rows])
    return GlobalMemory(ids, positions, positions >= 0, size, share)


class MemoryCache:
    """GEMFormer's first pass per document, computed once (the MLM is frozen)."""

    def __init__(self, mlm: AlbertForPretraining, window: int, gm: GlobalMemoryConfig) -> None:
        self.mlm, self.window, self.gm = mlm.eval(), window, gm
        self.kept: dict[Key, _Kept] = {}

    def fill(self, docs: Sequence[Sequence[int]], batch_size: int) -> None:
        todo = list(dict.fromkeys(tuple(d) for d in docs if tuple(d) not in self.kept))
        for start in range(0, len(todo), batch_size):
            chunk = todo[start : start + batch_size]
            ids, mask = pad_batch(chunk)
            mem = select_memory(self.mlm, ids, mask, self.window, self.gm.threshold, self.gm.budget)
            for b, key in enumerate(chunk):
                m = mem.mask[b]
                self.kept[key] = _Kept(
                    mem.ids[b, m].tolist(), mem.positions[b, m].tolist(), float(mem.share[b])
                )

    def memory(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> GlobalMemory:
        docs = [
            tuple(row[m.bool()].tolist()) for row, m in zip(input_ids, attention_mask, strict=True)
        ]
        self.fill(docs, len(docs))
        return _memory_of([self.kept[d] for d in docs])

    def stats(self, docs: Sequence[Sequence[int]]) -> dict[str, float]:
        rows = [self.kept[tuple(d)] for d in docs]
        sizes = torch.tensor([len(r.ids) for r in rows], dtype=torch.float)
        shares = torch.tensor([r.share for r in rows])
        return {
            "memory_size_mean": float(sizes.mean()),
            "memory_size_max": float(sizes.max()),
            "memory_share_mean": float(shares.mean()),
        }


class CachedMemoryEncoder(WindowReader):
    """`encoder` reading `[CLS] memory [SEP] window` per window, memory from the cache."""

    def __init__(self, encoder: Encoder, cache: MemoryCache) -> None:
        super().__init__(encoder)
        self._cache = (cache,)  # not a submodule: the MLM is neither trained nor saved

    def read(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> LongOutput:
        cache = self._cache[0]
        mem = cache.memory(input_ids.cpu(), attention_mask.cpu())
        return encode_with_memory(self.encoder, input_ids, attention_mask, mem, cache.window)


@dataclass
class LongDocuments:
    """The chosen reading for one fine-tuning command; `attach` wraps each seed's encoder."""

    mode: str
    window: int
    cache: MemoryCache | None = None
    stats: dict[str, float] = field(default_factory=dict)

    def attach(self, classifier: Any) -> None:
        if self.cache is None:
            classifier.encoder = LongDocumentEncoder(classifier.encoder, self.window)
        else:
            classifier.encoder = CachedMemoryEncoder(classifier.encoder, self.cache)

    @staticmethod
    def detach(classifier: Any) -> None:
        """Back to the plain encoder, so the saved classifier has the keys of any other one
        (`tibnlp predict` loads it; it reads a document's first window)."""
        if isinstance(classifier.encoder, WindowReader):
            classifier.encoder = classifier.encoder.encoder

    def figures(self) -> dict[str, float]:
        """What each run logs: the window, and the memory figures per split (memory mode)."""
        return {"long_document_window": float(self.window), **self.stats}


def setup_long_documents(
    ft: FinetuneConfig,
    model_cfg: ModelConfig,
    gm: GlobalMemoryConfig,
    window: int,
    ids: dict[str, list[list[int]]],
) -> LongDocuments | None:
    """None for `truncate`; for `memory` also the first pass over every split's documents.

    `gm` (threshold, budget) comes from the fine-tuning command's `model.global_memory`, so
    it can be changed without pretraining again; memory mode records it, enabled, in
    `model_cfg` (the classifier's saved model config, part of the seed fingerprint).
    """
    if ft.long_document == "truncate":
        return None
    if ft.encoder != "albert":
        raise ConfigError(
            f"config key 'finetune.long_document': {ft.long_document} needs the ALBERT encoder",
            "use finetune.long_document=truncate with encoder 'none'",
        )
    if torch.cuda.is_available():  # fine-tuning trains where the engine runs: the GPU
        raise ConfigError(
            f"config key 'finetune.long_document': {ft.long_document} runs on the CPU only",
            "hide the GPUs (CUDA_VISIBLE_DEVICES=) or use long_document=truncate on a GPU",
        )
    if ft.long_document == "segments":
        return LongDocuments("segments", window)
    if ft.random_init:
        raise ConfigError(
            "config key 'finetune.long_document': memory selects tokens with the pretrained "
            "MLM, so it needs a pretrained model",
            "pass --model DIR (a pretraining output) or use long_document=segments",
        )
    need = 1 + gm.budget + 1 + (window - 1)
    if model_cfg.position == "absolute" and need > model_cfg.max_len:
        raise ConfigError(
            f"config key 'model.global_memory.budget': [CLS] + {gm.budget} memory + [SEP] + "
            f"a {window}-token window is {need} positions > the model's max_len "
            f"{model_cfg.max_len}",
            "lower model.global_memory.budget or finetune.max_len",
        )
    model_cfg.global_memory = dataclasses.replace(gm, enabled=True)
    from tibnlp.models.memory_report import load_mlm

    mlm, _ = load_mlm(Path(ft.model))
    cache = MemoryCache(mlm, window, gm)
    stats: dict[str, float] = {}
    for split, docs in ids.items():
        cache.fill(docs, ft.eval_batch_size)
        stats.update({f"{split}_{k}": v for k, v in cache.stats(docs).items()})
    return LongDocuments("memory", window, cache, stats)
