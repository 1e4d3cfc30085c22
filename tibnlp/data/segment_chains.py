"""Pretraining examples for segment recurrence: chains of consecutive segments of one document.

With `model.recurrence.mem_len > 0`, `tibnlp pretrain` reads each example as a stream
(`AlbertForPretraining.mlm_over_segments`, on the segments of
`tibnlp.models.long_documents.windows`): an example is `[CLS]` followed by up to
`segments x (seq_len - 1)` consecutive content tokens of ONE document
(`pretrain.recurrence_segments`), so that cut into windows of `seq_len` positions (the [CLS]
repeated at the head of each, the segmenting rule of `windows.segments`) it gives `segments`
consecutive segments, each reading the previous ones through the gradient-stopped memory.
Sentences are concatenated in document order without
[SEP]; a chain ends at a syllable boundary where one lies within the limit; a document longer
than one chain gives several chains, its tail a shorter one (kept if it has >= 2 tokens).

SOP is not trained in this mode: sentence order needs two segments side by side in one input,
while here the input is a single stream read window by window. `sop_label` is stored as 0 and
the model ignores it; the loss is MLM only (MODELS.md section 4, tibnlp's reading).
"""

from __future__ import annotations

from typing import Any

from tibnlp.data.words import WORD, boundary_columns
from tibnlp.text.vocab import Vocabulary


def chain_lengths(length: int, seq_len: int) -> list[int]:
    """Positions of each segment ([CLS] copy included) of an example of `length` tokens."""
    content, step = length - 1, seq_len - 1
    full, rest = divmod(content, step)
    return [seq_len] * full + ([rest + 1] if rest else [])


def make_chains(
    doc_id: int,
    sentences: list[list[int]],
    vocab: Vocabulary,
    seq_len: int,
    segments: int,
    levels: list[list[int]] | None = None,
) -> list[dict[str, Any]]:
    """The chain examples of one document (see the module docstring); `levels` as in
    `tibnlp.data.sop_examples.make_examples` (adds `word_start`)."""
    limit = segments * (seq_len - 1)
    ids = [t for s in sentences for t in s]
    head = WORD if levels is not None else True
    if levels is not None:
        starts: list = [x for s in levels for x in s]
    else:
        starts = vocab.syllable_starts(ids) if ids else []
    out: list[dict[str, Any]] = []
    while len(ids) >= 2:
        cut = len(ids)
        if cut > limit:
            top = max(starts[limit // 2 : limit + 1])  # a word start where there is one
            cut = max(
                (i for i in range(limit // 2, limit + 1) if top and starts[i] == top),
                default=limit,
            )
        part, part_starts = ids[:cut], starts[:cut]
        rest = ids[cut:]
        starts = [head, *starts[cut + 1 :]] if rest else []
        ids = rest
        n = len(part) + 1
        out.append(
            {
                "input_ids": [vocab.cls_id, *part],
                "token_type_ids": [0] * n,
                **boundary_columns([head, *part_starts], levels is not None),
                "sop_label": 0,
                "length": n,
                "doc_id": doc_id,
            }
        )
    return out
