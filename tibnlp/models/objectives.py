"""The model a pretraining objective trains: the encoder with its heads (MLM, with SOP or a
contrastive projection as configured) or ELECTRA's generator and discriminator. One place,
for `tibnlp pretrain` and for `tibnlp model describe`, whose counts are of what is built."""

from __future__ import annotations

from tibnlp.config.model import ModelConfig
from tibnlp.config.train import PretrainConfig
from tibnlp.models.electra import ElectraForPretraining
from tibnlp.models.pretraining import AlbertForPretraining

Model = ElectraForPretraining | AlbertForPretraining


def pretraining_model(model_cfg: ModelConfig, p: PretrainConfig, segment_len: int = 0) -> Model:
    """`segment_len`: the length of the segments a chained document is read in (0: none)."""
    if p.objective == "electra":
        return ElectraForPretraining(
            model_cfg, p.generator_ratio, p.rtd_weight, p.sparse_last_layer
        )
    return AlbertForPretraining(
        model_cfg,
        p.sparse_last_layer,
        segment_len=segment_len,
        sop=p.sop,
        contrastive=p.contrastive,
        temperature=p.contrastive_temperature,
    )


def heads_name(p: PretrainConfig) -> str:
    """What sits above the encoder, in words ("MLM + SOP", "ELECTRA generator + RTD")."""
    if p.objective == "electra":
        return "ELECTRA generator + RTD"
    return " + ".join(
        ["MLM", *(["SOP"] if p.sop else []), *(["contrast"] if p.contrastive else [])]
    )
