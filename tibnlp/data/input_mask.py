"""Pieces hidden behind [MASK] in fine-tuning's training batches (`finetune.input_mask`).

Token cutoff (Shen et al. 2020) read as a transfer lever: a pretrained encoder has learnt to
fill a masked piece from its context, so a title with pieces hidden still reads whole to it,
and the head learns to use that context; to a random-init encoder the hidden piece is simply
gone (word dropout, as in DAN). Validation, test and `predict` read every piece.
"""

from __future__ import annotations

from collections.abc import Collection

import torch

MASK_SALT = 3_000_017  # the draw of batch key k under seed s is seeded with s * SALT + k


class InputMasker:
    """Replaces each real piece (not [CLS], [SEP], padding or another special) with [MASK] with
    probability `prob`, from a generator per (seed, batch key): a resumed or repeated run hides
    the same pieces."""

    def __init__(self, mask_id: int, special_ids: Collection[int], prob: float, seed: int) -> None:
        if not 0.0 < prob < 1.0:
            raise ValueError(f"input mask probability must be in (0, 1), got {prob}")
        self.mask_id, self.prob, self.seed = mask_id, prob, seed
        self.special = torch.tensor(sorted(set(special_ids) | {mask_id}), dtype=torch.long)

    def __call__(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, key: int
    ) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * MASK_SALT + key)
        real = attention_mask.bool() & ~torch.isin(input_ids, self.special)
        hide = real & (torch.rand(input_ids.shape, generator=g) < self.prob)
        return input_ids.masked_fill(hide, self.mask_id)
