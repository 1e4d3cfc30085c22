"""Token ids for classification: `[CLS] pieces [SEP]`, truncated, padded per batch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch


class TokenizerLike(Protocol):
    """What classification needs from `tibnlp.text.vocab.Vocabulary`."""

    pad_id: int
    cls_id: int
    sep_id: int

    def encode(self, text: str) -> list[int]: ...


def encode_texts(vocab: TokenizerLike, texts: Sequence[str], max_len: int) -> list[list[int]]:
    """`max_len` counts [CLS] and [SEP]: the seed paper's 50 (titles) is the whole sequence."""
    return encode_counting_cuts(vocab, texts, max_len)[0]


def encode_counting_cuts(
    vocab: TokenizerLike, texts: Sequence[str], max_len: int
) -> tuple[list[list[int]], list[int]]:
    """`encode_texts`, and the pieces each text lost to the cut at `max_len` (0: none), so a
    run can say how much text it did not read."""
    body = max_len - 2
    ids, dropped = [], []
    for text in texts:
        pieces = vocab.encode(text)
        ids.append([vocab.cls_id, *pieces[:body], vocab.sep_id])
        dropped.append(max(0, len(pieces) - body))
    return ids, dropped


class SamplingTokenizer(TokenizerLike, Protocol):
    def sample(
        self, texts: Sequence[str], alpha: float, nbest: int, seed: int
    ) -> list[list[int]]: ...


SEGMENT_SALT = 2_000_003  # the draw of batch key k under seed s is seeded with s * SALT + k


class SampledSegmentation:
    """Training texts re-segmented batch by batch (`finetune.subword_alpha`): the rows of a
    batch, framed and cut as `encode_texts` frames them. The draw depends on the seed and the
    batch's key alone, so a resumed run and a second process read the same pieces."""

    def __init__(
        self,
        vocab: SamplingTokenizer,
        texts: Sequence[str],
        max_len: int,
        alpha: float,
        nbest: int,
        seed: int,
    ) -> None:
        self.vocab, self.texts, self.body = vocab, texts, max_len - 2
        self.alpha, self.nbest, self.seed = alpha, nbest, seed

    def __call__(self, indices: Sequence[int], key: int) -> list[list[int]]:
        drawn = self.vocab.sample(
            [self.texts[i] for i in indices],
            self.alpha,
            self.nbest,
            self.seed * SEGMENT_SALT + key,
        )
        v = self.vocab
        return [[v.cls_id, *pieces[: self.body], v.sep_id] for pieces in drawn]


def pad_batch(ids: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), both [B, longest in batch]."""
    longest = max(len(x) for x in ids)
    input_ids = torch.full((len(ids), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(ids), longest), dtype=torch.long)
    for i, row in enumerate(ids):
        input_ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    return input_ids, mask
