"""Does a pretrained model use word order? Held-out MLM accuracy with each text's tokens in
their order and shuffled.

Why: an encoder whose positions never became useful predicts a masked piece from the bag of
pieces around it. Its MLM accuracy leaves the unigram level (so the not-learning check stays
quiet) and then stalls. On the CPU recipe with learned absolute positions that stall was at
11-12 % for every shape and batch size tried, with shuffled text scoring within 0.4 points of
real text (benchmarks/results/positions.md). The gap between the two accuracies is the measure.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

IGNORE = -100


def shuffle_order(batch: dict[str, torch.Tensor], seed: int = 0) -> dict[str, torch.Tensor]:
    """A copy of an MLM batch with each row's real tokens after position 0 ([CLS]) permuted,
    their labels and token types moving with them; padding stays at the end."""
    gen = torch.Generator().manual_seed(seed)
    out = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    rows, width = out["input_ids"].shape
    for row in range(rows):
        n = int(out["attention_mask"][row].sum())
        if n <= 2:
            continue
        order = torch.cat(
            [torch.zeros(1, dtype=torch.long), 1 + torch.randperm(n - 1, generator=gen)]
        )
        order = torch.cat([order, torch.arange(n, width)])
        for key in ("input_ids", "mlm_labels", "token_type_ids"):
            if isinstance(out.get(key), torch.Tensor):
                out[key][row] = out[key][row][order.to(out[key].device)]
    return out


@torch.no_grad()
def order_accuracies(
    model: nn.Module, batches: Iterable[dict[str, torch.Tensor]], seed: int = 0
) -> tuple[float, float]:
    """(accuracy on the texts as written, accuracy on them shuffled) over the masked pieces of
    `batches`, for an `AlbertForPretraining` (its `encoder` and `mlm_logits`). NaN for both
    when no piece is masked: nothing was measured, which a 0 % would hide."""
    was_training = model.training
    model.eval()
    hits = {False: 0, True: 0}
    total = 0
    try:
        for i, batch in enumerate(batches):
            for shuffled in (False, True):
                b = shuffle_order(batch, seed + i) if shuffled else batch
                labels = b["mlm_labels"]
                sel = labels != IGNORE
                if not bool(sel.any()):
                    continue
                hidden = model.encoder(  # type: ignore[operator]
                    b["input_ids"], b["attention_mask"], b.get("token_type_ids")
                ).hidden
                logits = model.mlm_logits(hidden[sel])  # type: ignore[operator]
                hits[shuffled] += int((logits.argmax(-1) == labels[sel]).sum())
                total += int(sel.sum()) if not shuffled else 0
    finally:
        model.train(was_training)
    if not total:
        return math.nan, math.nan
    return hits[False] / total, hits[True] / total


def is_order_blind(in_order: float, shuffled: float, unigram: float) -> bool:
    """True when shuffling the text keeps at least 90 % of what the model gained over the
    unigram level: it reads a bag of pieces, not a sentence."""
    gained = in_order - unigram
    return gained > 0 and shuffled - unigram >= 0.9 * gained
