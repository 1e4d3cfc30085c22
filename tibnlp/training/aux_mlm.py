"""Masked-LM beside the classification loss while fine-tuning (`finetune.mlm_weight`).

Chronopoulou et al. (2019, "An Embarrassingly Simple Approach for Transfer Learning from
Pretrained Language Models") keep the language-model loss on the task's own texts while
fine-tuning a classifier: the encoder keeps predicting masked pieces, so the knowledge that
7,000 labelled titles cannot teach is not traded away for the labels. Here each training batch
is read twice: once as is, for the classification loss, and once with `mlm_prob` of its real
pieces masked (80 % [MASK], 10 % a random piece, 10 % kept), for the MLM loss through the
pretrained model's own MLM head (decoder tied to the encoder's word embedding). The total is
`cross_entropy + mlm_weight * mlm_loss`. A random-init encoder gets a fresh head, so its twin
runs the same recipe. The head is a training aid: it is not part of the saved classifier.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import torch
from torch import nn

from tibnlp.config.model import ModelConfig
from tibnlp.data.masking import IGNORE_INDEX
from tibnlp.models.encoder import init_weights
from tibnlp.models.pretraining import mlm_head_logits

HEAD_KEYS = ("mlm_dense.weight", "mlm_dense.bias", "mlm_norm.weight", "mlm_norm.bias", "mlm_bias")


class MlmHead(nn.Module):
    """The pretraining MLM head's weights (state-dict keys as in `AlbertForPretraining`); the
    decoder is the encoder's word embedding, passed in at each call."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.mlm_dense = nn.Linear(cfg.hidden_size, cfg.embedding_size)
        self.mlm_norm = nn.LayerNorm(cfg.embedding_size, eps=cfg.layer_norm_eps)
        self.mlm_bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        for m in (self.mlm_dense, self.mlm_norm):
            init_weights(m, cfg.initializer_range)

    def forward(self, hidden: torch.Tensor, word: torch.Tensor) -> torch.Tensor:
        return mlm_head_logits(self.mlm_dense, self.mlm_norm, self.mlm_bias, word, hidden)

    def load_pretrained_head(self, model_dir: Path) -> None:
        """The head a pretraining run saved beside its encoder (read by `load_mlm`, which
        checks the folder is a pretraining model). Building that model draws random numbers:
        they come from a forked stream, so the run's own randomness is left as it was."""
        from tibnlp.models.memory_report import load_mlm

        with torch.random.fork_rng(devices=[]):
            mlm, _ = load_mlm(model_dir)
        state = mlm.state_dict()
        self.load_state_dict({k: state[k] for k in HEAD_KEYS})


class TokenMasker:
    """Masks `prob` of each text's real pieces (at least one), BERT's 80/10/10 way, with a
    generator per (seed, batch) so a resumed or repeated run masks alike."""

    def __init__(
        self, vocab_size: int, mask_id: int, special_ids: Collection[int], prob: float, seed: int
    ) -> None:
        self.mask_id, self.prob, self.seed = mask_id, prob, seed
        self.special = torch.tensor(sorted(special_ids), dtype=torch.long)
        regular = sorted(set(range(vocab_size)) - set(special_ids))
        self.regular = torch.tensor(regular, dtype=torch.long)

    def __call__(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, key: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(masked ids, labels: the original piece where masked, IGNORE_INDEX elsewhere)."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + key)
        real = attention_mask.bool() & ~torch.isin(input_ids, self.special)
        scores = torch.rand(input_ids.shape, generator=g).masked_fill(~real, 2.0)
        count = (real.sum(1).float() * self.prob).round().clamp(min=1).long()
        rank = scores.argsort(1).argsort(1)  # each position's rank among its row's draws
        chosen = real & (rank < count[:, None])
        labels = input_ids.masked_fill(~chosen, IGNORE_INDEX)
        roll = torch.rand(input_ids.shape, generator=g)
        swaps = self.regular[torch.randint(len(self.regular), input_ids.shape, generator=g)]
        masked = input_ids.masked_fill(chosen & (roll < 0.8), self.mask_id)
        swap = chosen & (roll >= 0.8) & (roll < 0.9)
        masked = torch.where(swap, swaps, masked)
        return masked, labels
