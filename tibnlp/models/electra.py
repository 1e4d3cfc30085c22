"""Replaced-token detection (ELECTRA, Clark et al. 2020): `pretrain.objective: electra`.

A small generator (an MLM model `generator_ratio` times the encoder's width, same depth)
fills the masked positions with samples from its own predictions; the encoder being trained,
the discriminator, then tells for every real token whether it is the original or a
replacement. Why: MLM learns from the masked 15-30% of the tokens only, the discriminator
from all of them, which the paper measures as more downstream quality per FLOP at small
scale.

The generator shares the word embedding with the discriminator (the paper's tied-token
variant) and decodes through it, so the embedding learns from the generator's MLM loss as
well. The discriminator is `encoder`: a saved model directory holds it under `encoder.*`,
exactly where `finetune --model` reads an MLM-pretrained encoder; the generator's weights
(`generator.*`) and the detection head (`rtd_*`) travel beside it, so `pretrain.init_from`
continues the whole model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tibnlp.config.model import HeadsConfig, ModelConfig
from tibnlp.models.encoder import Encoder, init_weights
from tibnlp.models.pretraining import IGNORE, AlbertForPretraining

# the key the generator's tied word embedding would be saved under: the same tensor as
# `encoder.embeddings.word.weight`, so it is neither saved nor expected on load
TIED_KEY = "generator.encoder.embeddings.word.weight"


def generator_config(cfg: ModelConfig, ratio: float) -> ModelConfig:
    """The generator's shape: width and FFN `ratio` x the encoder's, same depth and design,
    head width kept (so fewer heads), fixed head count (no routing of its own)."""
    heads = max(1, round(cfg.heads.small * ratio))
    width = max(heads, round(cfg.hidden_size * ratio / heads) * heads)
    return dataclasses.replace(
        cfg,
        hidden_size=width,
        ffn_size=max(1, round(cfg.ffn_size * ratio)),
        heads=HeadsConfig(small=heads, large=heads, threshold=0),
    )


class ElectraForPretraining(nn.Module):
    """`forward(input_ids, attention_mask, token_type_ids, mlm_labels, sop_labels=None) -> dict`.

    `input_ids` are the masked inputs of `MlmCollator`, `mlm_labels` the originals at the
    masked positions (-100 elsewhere). `loss = mask_loss + rtd_weight * rtd_loss`; also
    reported: the generator's `mask_accuracy`, the discriminator's `rtd_accuracy`, and
    `replaced_share` (share of real tokens the generator changed).
    """

    def __init__(
        self,
        cfg: ModelConfig,
        generator_ratio: float = 0.5,
        rtd_weight: float = 50.0,
        sparse_last_layer: bool = True,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.rtd_weight = rtd_weight
        self.encoder = Encoder(cfg)
        self.generator = AlbertForPretraining(
            generator_config(cfg, generator_ratio), sparse_last_layer, sop=False
        )
        self.generator.encoder.embeddings.word = self.encoder.embeddings.word  # tied
        d = cfg.hidden_size
        self.rtd_dense = nn.Linear(d, d)
        self.rtd_out = nn.Linear(d, 1)
        for m in (self.rtd_dense, self.rtd_out):
            init_weights(m, cfg.initializer_range)

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """Without the generator's copy of the tied embedding (safetensors refuses shared
        tensors, and loading the encoder's sets both)."""
        state = super().state_dict(*args, **kwargs)
        prefix = kwargs.get("prefix", args[1] if len(args) > 1 else "")
        state.pop(prefix + TIED_KEY, None)
        return state

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any:
        """Accepts a state without the tied key (as saved), restoring it from the encoder's."""
        state = dict(state_dict)
        state.setdefault(TIED_KEY, state.get("encoder.embeddings.word.weight"))
        if state[TIED_KEY] is None:
            del state[TIED_KEY]
        return super().load_state_dict(state, strict=strict, assign=assign)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None,
        mlm_labels: torch.Tensor,
        sop_labels: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        del sop_labels  # no pair task: the objective is per token
        sel = mlm_labels != IGNORE
        gen = self.generator
        read = sel if gen.sparse_last_layer else None  # the generator is read where masked
        hidden = gen.encoder(input_ids, attention_mask, token_type_ids, outputs_at=read).hidden
        logits, mask_loss, mask_acc = gen.masked_lm(hidden, mlm_labels)
        original = torch.where(sel, mlm_labels, input_ids)
        corrupted = original.clone()
        if logits is not None:  # samples, not the argmax: the paper's replacements
            probs = logits.detach().float().softmax(-1)
            corrupted[sel] = torch.multinomial(probs, 1).squeeze(-1)
        replaced = (corrupted != original).float()
        out = self.encoder(corrupted, attention_mask, token_type_ids)
        real = attention_mask.bool()
        scores = self.rtd_out(F.gelu(self.rtd_dense(out.hidden[real]))).squeeze(-1)
        target = replaced[real]
        rtd_loss = F.binary_cross_entropy_with_logits(scores.float(), target)
        rtd_acc = ((scores > 0).float() == target).float().mean()
        return {
            "loss": mask_loss + self.rtd_weight * rtd_loss,
            "mask_loss": mask_loss.detach(),
            "mask_accuracy": mask_acc.detach(),
            "rtd_loss": rtd_loss.detach(),
            "rtd_accuracy": rtd_acc.detach(),
            "replaced_share": target.mean().detach(),
            "route_large_fraction": out.route_large_fraction.detach(),
        }
