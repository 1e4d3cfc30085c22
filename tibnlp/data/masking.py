"""ALBERT n-gram masking over whole Tibetan syllables, and the MLM + SOP batch collator.

Units: a unit is one syllable as the vocabulary segments it (a run of pieces from one
`syllable_start=True` piece to the next), so a masked span is n whole syllables and never
cuts one. This is our reading of MODELS.md's "spans never crossing a Tibetan syllable
boundary": a span may cover several syllables (n <= 3), but its two ends always sit on
syllable boundaries. Special tokens ([CLS], [SEP], ...) are never units, so never masked.

Whole-word masking (`pretrain.masking: whole_word`): a unit is one botok word instead (a run
of whole syllable units from one `word_start=True` piece to the next: `tibnlp.data.words`), so
all the pieces of a word are masked together and an n-gram is n whole words. The budget stays
counted in pieces (15% of the real tokens): a word that would overrun it is passed over for a
shorter one, so at ~1.4 pieces per word the rate stays at the budget (benchmarks/results/wwm.md).

Selection follows ALBERT's `create_masked_lm_predictions`: 15% of the real tokens are the
budget; span starts are visited in random order, each draws n with p(n) proportional to 1/n
(shortened when it would overrun the budget), spans overlapping earlier ones are skipped. Each
chosen token becomes [MASK] with p=0.8, a random regular token with p=0.1, stays with p=0.1.

Rare-first masking (`pretrain.mask_rarity` = a > 0): span starts are visited in a random
order weighted by p^-a instead of uniformly, p the unigram probability (the vocabulary's own
SentencePiece score) of the unit's rarest piece, so rare units are predicted more often and
common ones fill the rest of the same budget. The order is a weighted draw without
replacement (Efraimidis and Spirakis 2006: sort by log(E) - log w, E ~ Exp(1)); a = 0 keeps
ALBERT's uniform permutation, with the same masks as before the option existed. [UNK] and
user-defined symbols carry score 0 in the model file, so they weigh as the commonest pieces:
predicting "a character the vocabulary lacks" teaches nothing about a rare word, and the
budget is better spent on scored pieces.

Same-document pairs (`split_pairs`, for `pretrain.contrastive`): each example's A and B
segments (two consecutive stretches of one document) become two rows, `[CLS] A [SEP]` and
`[CLS] B [SEP]`, at 2i and 2i + 1, masked like any other row; the model reads them as a pair.

Randomness is a `torch.Generator` seeded from (seed, batch_index) only, so a batch's masking is
a pure function of (seed, batch_index, examples): a resumed run reproduces it exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Protocol

import numpy as np
import torch

from tibnlp.errors import DataError
from tibnlp.text.special import CONTROL_IDS, MASK_ID, PAD_ID, SEP_ID, UNK_ID

IGNORE_INDEX = -100


class _VocabLike(Protocol):
    size: int
    pad_id: int
    mask_id: int
    special_ids: frozenset[int]


@dataclass(frozen=True)
class MaskingIds:
    """What masking needs from a vocabulary (a `Vocabulary` works as well)."""

    size: int
    pad_id: int = PAD_ID
    unk_id: int = UNK_ID
    mask_id: int = MASK_ID
    special_ids: frozenset[int] = CONTROL_IDS


def ngram_probs(max_ngram: int) -> torch.Tensor:
    """p(n) proportional to 1/n for n = 1..max_ngram."""
    p = 1.0 / torch.arange(1, max_ngram + 1, dtype=torch.float64)
    return p / p.sum()


def syllable_units(syllable_start: Sequence[bool], is_special: Sequence[bool]) -> list[list[int]]:
    """Token positions grouped into syllable units; special tokens belong to none.

    The per-row definition of a unit: `MlmCollator` finds the same units for a whole batch at
    once with array operations (tests/test_masking.py holds the two equal)."""
    units: list[list[int]] = []
    for pos, (start, special) in enumerate(zip(syllable_start, is_special, strict=True)):
        if special:
            continue
        if start or not units or units[-1][-1] != pos - 1:
            units.append([pos])
        else:
            units[-1].append(pos)
    return units


def sample_spans(
    units: list[list[int]],
    budget: int,
    probs: torch.Tensor,
    generator: torch.Generator,
) -> list[list[int]]:
    """ALBERT span selection: lists of unit indices (each span n consecutive units)."""
    return [
        list(range(start, start + n))
        for start, n in _span_starts([len(u) for u in units], budget, probs, generator)
    ]


def _weighted_order(count: int, log_weights: np.ndarray, generator: torch.Generator) -> list[int]:
    """Indices 0..count-1 drawn without replacement with weights exp(log_weights): sorted by
    log(E) - log w, E ~ Exp(1) (Efraimidis-Spirakis). u = 0 gives E = 0, a key of -inf: that
    unit first, the limit of the draw. Ties in the key (equal weights whose size swamps
    log(E) in float64, at a huge exponent) fall back to log(E), a uniform order among them,
    not the row's left-to-right one."""
    u = torch.rand(count, generator=generator, dtype=torch.float64).numpy()
    with np.errstate(divide="ignore"):
        log_e = np.log(-np.log1p(-u))
    return np.lexsort((log_e, log_e - log_weights)).tolist()


def rarity_log_weights(log_probs: Sequence[float], rarity: float) -> np.ndarray:
    """Each piece's log weight for rare-first masking, -rarity x log p (0 for a piece scored
    0: [UNK], specials, user-defined symbols). Refuses weights past float64."""
    log_p = np.asarray(log_probs, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        weights = -rarity * log_p
    if not np.isfinite(weights).all():
        raise ValueError(
            f"pretrain.mask_rarity={rarity}: p^-rarity overflows float64 (or a piece's log "
            "probability is not finite); use a smaller exponent"
        )
    return weights


def _span_starts(
    sizes: list[int],
    budget: int,
    probs: torch.Tensor,
    generator: torch.Generator,
    log_weights: np.ndarray | None = None,
) -> list[tuple[int, int]]:
    """ALBERT's span selection as (first unit, unit count) pairs, from the units' token counts.

    The collator's hot path (about 64 rows a step): plain lists, a prefix sum for span sizes,
    two generator calls per row (a permutation of the starts, then the n draws), in the order
    the per-row collator before it used, so its masks are unchanged
    (benchmarks/results/collate.md). `log_weights` (one per unit): visit the starts in a
    weighted order instead, heavier first on average (rare-first masking)."""
    count = len(sizes)
    if not count or budget <= 0:
        return []
    max_n = len(probs)
    if log_weights is None:
        order = torch.randperm(count, generator=generator).tolist()
    else:
        order = _weighted_order(count, log_weights, generator)
    draws = (torch.multinomial(probs, count, replacement=True, generator=generator) + 1).tolist()
    ends = [0, *accumulate(sizes)]  # ends[u]: tokens in units [0, u)
    covered = bytearray(count)
    spans: list[tuple[int, int]] = []
    n_tokens = 0
    for start, n in zip(order, draws, strict=True):
        if n_tokens >= budget:
            break
        n = min(n, max_n, count - start)
        while n > 1 and n_tokens + ends[start + n] - ends[start] > budget:
            n -= 1  # shorten rather than overrun the budget
        size = ends[start + n] - ends[start]
        if n_tokens + size > budget or any(covered[start : start + n]):
            continue
        covered[start : start + n] = b"\x01" * n
        spans.append((start, n))
        n_tokens += size
    return spans


class MlmCollator:
    """Pads a list of pretraining examples into a batch and applies n-gram masking."""

    def __init__(
        self,
        vocab: _VocabLike,
        mask_prob: float = 0.15,
        max_ngram: int = 3,
        seed: int = 42,
        whole_word: bool = False,
        split_pairs: bool = False,
        rarity: float = 0.0,
    ) -> None:
        if not 0.0 < mask_prob < 1.0:
            raise ValueError("mask_prob must be in (0, 1)")
        if not (math.isfinite(rarity) and rarity >= 0):
            raise ValueError(f"rarity must be a finite number >= 0, got {rarity}")
        if max_ngram < 1:
            raise ValueError("max_ngram must be >= 1")
        self.size = int(vocab.size)
        self.pad_id = int(vocab.pad_id)
        self.mask_id = int(vocab.mask_id)
        self.special_ids = frozenset(int(i) for i in vocab.special_ids)
        unk = getattr(vocab, "unk_id", None)  # [UNK] may be predicted but is no replacement
        regular = [i for i in range(self.size) if i not in self.special_ids and i != unk]
        if not regular:
            raise ValueError("the vocabulary has no regular tokens to sample replacements from")
        self._regular = torch.tensor(regular, dtype=torch.long)
        self.mask_prob = mask_prob
        self.probs = ngram_probs(max_ngram)
        self.seed = seed
        self.unit_column = "word_start" if whole_word else "syllable_start"
        self._special = np.array(sorted(self.special_ids), dtype=np.int64)
        self.split_pairs = split_pairs
        # rare-first masking: each piece's log weight, -rarity x its unigram log probability
        self._log_weight: np.ndarray | None = None
        if rarity:
            log_probs = getattr(vocab, "piece_log_probs", None)
            if log_probs is None:
                raise ValueError("rare-first masking needs a Vocabulary (its piece log probs)")
            self._log_weight = rarity_log_weights(log_probs(), rarity)
            if len(self._log_weight) != self.size:
                raise ValueError(
                    f"{len(self._log_weight)} piece log probs for a vocabulary of {self.size}"
                )

    def _split(self, ex: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """`[CLS] A [SEP] B [SEP]` -> `[CLS] A [SEP]`, `[CLS] B [SEP]` (columns cut alike)."""
        ids = list(ex["input_ids"])
        if SEP_ID not in ids[:-1]:
            raise DataError(
                "a pretraining example has no [SEP] between its segments",
                "pretrain.contrastive reads A/B pair examples (not segment chains)",
            )
        cut = ids.index(SEP_ID) + 1
        a: dict[str, Any] = {"sop_label": 0, "token_type_ids": [0] * cut}
        b: dict[str, Any] = {"sop_label": 0, "token_type_ids": [0] * (len(ids) - cut + 1)}
        for key in ("input_ids", "syllable_start", "word_start"):
            if key in ex:
                col = list(ex[key])
                a[key], b[key] = col[:cut], col[:1] + col[cut:]  # B opens with A's [CLS]
        return a, b

    def generator(self, batch_index: int) -> torch.Generator:
        # Distinct, reproducible streams per (seed, batch); the mix keeps neighbours apart.
        mixed = (self.seed * 0x9E3779B97F4A7C15 + batch_index * 0xBF58476D1CE4E5B9) % (2**63)
        return torch.Generator().manual_seed(mixed)

    def __call__(self, examples: list[dict[str, Any]], batch_index: int) -> dict[str, torch.Tensor]:
        g = self.generator(batch_index)
        if self.split_pairs:
            examples = [row for ex in examples for row in self._split(ex)]
        if any(self.unit_column not in ex for ex in examples):
            raise DataError(
                f"whole-word masking needs the example column {self.unit_column!r}",
                "build the pretraining data with masking='whole_word' (pretrain.masking)",
            )
        lengths = [len(ex["input_ids"]) for ex in examples]
        width, batch = max(lengths), len(examples)
        # The batch is laid out once as arrays; only the span draw runs per row (a step's
        # host time on a GPU: benchmarks/bench_collate.py).
        ids = np.full((batch, width), self.pad_id, dtype=np.int64)
        types = np.zeros((batch, width), dtype=np.int64)
        unit_start = np.zeros((batch, width), dtype=bool)
        for row, ex in enumerate(examples):
            n = lengths[row]
            ids[row, :n] = ex["input_ids"]
            types[row, :n] = ex["token_type_ids"]
            unit_start[row, :n] = ex[self.unit_column]
        real = np.arange(width)[None, :] < np.asarray(lengths)[:, None]
        special = np.isin(ids, self._special) | ~real
        # A unit (syllable or word) opens at a start flag or after a special token and runs
        # over the regular tokens that follow (`syllable_units`); ids count units batch-wide.
        prev_special = np.ones_like(special)
        prev_special[:, 1:] = special[:, :-1]
        begins = ~special & (unit_start | prev_special)
        unit_of = np.cumsum(begins.reshape(-1)).reshape(batch, width) - 1
        sizes = np.bincount(unit_of[~special], minlength=int(begins.sum())).tolist()
        first = np.concatenate([[0], np.cumsum(begins.sum(axis=1))]).tolist()
        n_real = (~special).sum(axis=1).tolist()
        picked = np.zeros(len(sizes) + 1, dtype=bool)  # + 1: special positions read unit -1
        unit_weight = None
        if self._log_weight is not None:  # a unit weighs what its rarest piece does
            unit_weight = np.full(len(sizes), -np.inf)
            np.maximum.at(unit_weight, unit_of[~special], self._log_weight[ids[~special]])
        for row in range(batch):
            budget = max(1, round(n_real[row] * self.mask_prob)) if n_real[row] else 0
            lo, hi = first[row], first[row + 1]
            weights = None if unit_weight is None else unit_weight[lo:hi]
            for start, count in _span_starts(sizes[lo:hi], budget, self.probs, g, weights):
                picked[lo + start : lo + start + count] = True
        chosen_np = picked[unit_of] & ~special
        input_ids = torch.from_numpy(ids)
        token_types = torch.from_numpy(types)
        attention = torch.from_numpy(real.astype(np.int64))
        chosen = torch.from_numpy(chosen_np)
        labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
        roll = torch.rand((batch, width), generator=g)
        random_ids = self._regular[torch.randint(len(self._regular), (batch, width), generator=g)]
        masked = input_ids.clone()
        masked[chosen & (roll < 0.8)] = self.mask_id
        swap = chosen & (roll >= 0.8) & (roll < 0.9)
        masked[swap] = random_ids[swap]
        sop = torch.tensor([int(ex["sop_label"]) for ex in examples], dtype=torch.long)
        return {
            "input_ids": masked,
            "attention_mask": attention,
            "token_type_ids": token_types,
            "mlm_labels": labels,
            "sop_labels": sop,
        }
