"""Pretraining examples of one document: ALBERT's sentence-order pairs (`make_examples`).

Example filling (ALBERT's `create_instances_from_document`, with SOP): the sentences of ONE
document are accumulated until they reach a target of `seq_len - 3` tokens (with probability
`short_seq_prob` a random shorter target in [2, seq_len - 3], so the model also sees short
inputs), then cut at a random sentence boundary into A and B; with probability 1/2 they are
swapped (`sop_label` 1). A chunk of one sentence is cut at a syllable boundary near its middle.
Sentences longer than the budget are first split at syllable boundaries, so no text is lost to
truncation. Without a pair task (`pairs=False`: MLM only, no SOP, no same-document contrast) a
chunk of one sentence is not cut: it becomes `[CLS] text [SEP]`, all segment 0, the layout
fine-tuning reads a text in (a title of the title stage is one such chunk); chunks of several
sentences keep their A/B pair.

Consequence for `median_length` (the DMA-ALBERT threshold `m`): most examples are
full (close to `seq_len`); short ones come from the `short_seq_prob` draws and from document
tails, so the median sits near `seq_len` on long-document corpora and drops on corpora of
short documents. Measured on the real corpus (16000-piece vocabulary, short_seq_prob 0.1):
seq_len 512 -> median 468, mean 407; seq_len 128 -> median 116, mean 102. A median this close
to `seq_len` makes DMA's batch rule pick `h_l` for about half the batches; lower
`short_seq_prob` raises it, packing several documents per example would remove the tails.
"""

from __future__ import annotations

import random
from typing import Any

from tibnlp.data.words import WORD, boundary_columns
from tibnlp.text.vocab import Vocabulary


def _split_long(ids: list[int], starts: list, limit: int, head: int) -> list[tuple[list, list]]:
    """Cut a token sequence into parts of <= limit tokens at the strongest boundary within
    the limit (a word start, else a syllable start: `tibnlp.data.words` levels), the latest."""
    parts = []
    while len(ids) > limit:
        top = max(starts[1 : limit + 1])
        cut = max((i for i in range(1, limit + 1) if top and starts[i] == top), default=limit)
        parts.append((ids[:cut], starts[:cut]))
        ids, starts = ids[cut:], [head, *starts[cut + 1 :]]
    parts.append((ids, starts))
    return parts


def _pair(
    chunk: list[tuple[list, list]], rng: random.Random
) -> tuple[list[int], list[int], list[int], list[int]] | None:
    if len(chunk) >= 2:
        a_end = rng.randint(1, len(chunk) - 1)
        a = [t for s in chunk[:a_end] for t in s[0]], [t for s in chunk[:a_end] for t in s[1]]
        b = [t for s in chunk[a_end:] for t in s[0]], [t for s in chunk[a_end:] for t in s[1]]
        return a[0], a[1], b[0], b[1]
    ids, starts = chunk[0]
    top = max(starts[1:], default=0)
    cuts = [i for i in range(1, len(ids)) if top and starts[i] == top]
    if not cuts:
        return None
    cut = min(cuts, key=lambda i: abs(i - len(ids) / 2))
    return ids[:cut], starts[:cut], ids[cut:], starts[cut:]


def make_examples(
    doc_id: int,
    sentences: list[list[int]],
    vocab: Vocabulary,
    seq_len: int,
    rng: random.Random,
    short_seq_prob: float,
    sop_prob: float = 0.5,
    levels: list[list[int]] | None = None,
    pairs: bool = True,
) -> list[dict[str, Any]]:
    """SOP examples of one document (see the module docstring for the policy); `sop_prob`:
    the share of pairs whose segments are swapped (0: text in order, for MLM without SOP);
    `pairs=False`: no task reads the pair, so a one-sentence chunk stays one segment.

    `levels` (per sentence, per piece: `tibnlp.data.words.piece_levels`) adds the column
    `word_start`, and cuts prefer word boundaries; without it boundaries are syllables."""
    budget = seq_len - 3
    head = WORD if levels is not None else True
    parts = []
    for n, ids in enumerate(sentences):
        if ids:
            starts = levels[n] if levels is not None else vocab.syllable_starts(ids)
            parts.extend(_split_long(ids, starts, budget, head))
    out: list[dict[str, Any]] = []
    target = rng.randint(2, budget) if rng.random() < short_seq_prob else budget
    chunk: list[tuple[list, list]] = []
    size = 0
    for i, part in enumerate(parts):
        if chunk and size + len(part[0]) > budget:  # would overflow: emit what we have
            out.extend(_emit(doc_id, chunk, vocab, rng, sop_prob, head, pairs))
            chunk, size = [], 0
            target = rng.randint(2, budget) if rng.random() < short_seq_prob else budget
        chunk.append(part)
        size += len(part[0])
        if size >= target or i == len(parts) - 1:
            out.extend(_emit(doc_id, chunk, vocab, rng, sop_prob, head, pairs))
            chunk, size = [], 0
            target = rng.randint(2, budget) if rng.random() < short_seq_prob else budget
    return out


def _emit(
    doc_id: int,
    chunk: list[tuple[list, list]],
    vocab: Vocabulary,
    rng: random.Random,
    sop_prob: float,
    head: int = True,
    pairs: bool = True,
) -> list[dict[str, Any]]:
    pair = _pair(chunk, rng)
    if pair is None:
        return []
    a, a_starts, b, b_starts = pair
    # A and B each open a unit: a chunk of one word cut in two makes two words (masked apart)
    a_starts, b_starts = [head, *a_starts[1:]], [head, *b_starts[1:]]
    swapped = rng.random() < sop_prob  # drawn either way: the document's later draws stay
    if not pairs and len(chunk) == 1:  # nothing reads the cut: the sentence stays whole
        ids, starts = chunk[0]
        whole = [vocab.cls_id, *ids, vocab.sep_id]
        return [
            {
                "input_ids": whole,
                "token_type_ids": [0] * len(whole),
                **boundary_columns([head, head, *starts[1:], head], head == WORD),
                "sop_label": 0,
                "length": len(whole),
                "doc_id": doc_id,
            }
        ]
    if swapped:
        a, a_starts, b, b_starts = b, b_starts, a, a_starts
    ids = [vocab.cls_id, *a, vocab.sep_id, *b, vocab.sep_id]
    return [
        {
            "input_ids": ids,
            "token_type_ids": [0] * (len(a) + 2) + [1] * (len(b) + 1),
            **boundary_columns([head, *a_starts, head, *b_starts, head], head == WORD),
            "sop_label": int(swapped),
            "length": len(ids),
            "doc_id": doc_id,
        }
    ]
