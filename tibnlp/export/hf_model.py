"""A tibnlp pretraining directory as a Hugging Face ALBERT directory (`tibnlp export hf`).

tibnlp's default encoder *is* ALBERT: factorised embeddings, one shared post-LN layer, exact
GELU, the MLM decoder tied to the input embedding, SOP on a tanh pooler. So the export renames
tensors (splitting the fused Q/K/V projection) and writes `config.json` with
`model_type: albert`; `AutoModel`, `AutoModelForMaskedLM` and `AlbertForPreTraining` load it.
Designs stock ALBERT cannot compute are refused, naming the config key, rather than exported
into a model that would compute something else.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from tibnlp.config.model import ModelConfig
from tibnlp.errors import ConfigError, DataError
from tibnlp.export.hf_tokenizer import SPECIAL_TOKENS, build_tokenizer, tokenizer_config
from tibnlp.fsutil import check_new_folder, share, staged_dir
from tibnlp.models.io import (
    MISMATCH,
    WEIGHTS,
    check_vocab_of_weights,
    load_pretrained,
    shape_mismatches,
)
from tibnlp.text.vocab import Vocabulary

LAYER = "albert.encoder.albert_layer_groups.0.albert_layers.0."
_ENCODER = {  # tibnlp encoder tensor -> Hugging Face ALBERT tensor (weight and bias alike)
    "embeddings.word": "albert.embeddings.word_embeddings",
    "embeddings.position": "albert.embeddings.position_embeddings",
    "embeddings.segment": "albert.embeddings.token_type_embeddings",
    "embeddings.norm": "albert.embeddings.LayerNorm",
    "embeddings.project": "albert.encoder.embedding_hidden_mapping_in",
    "layer.attention_norm": LAYER + "attention.LayerNorm",
    "layer.ffn_in": LAYER + "ffn",
    "layer.ffn_out": LAYER + "ffn_output",
    "layer.ffn_norm": LAYER + "full_layer_layer_norm",
}
_HEADS = {
    "mlm_dense": "predictions.dense",
    "mlm_norm": "predictions.LayerNorm",
    "sop_pooler": "albert.pooler",
    "sop_classifier": "sop_classifier.classifier",
}


def unsupported(cfg: ModelConfig) -> list[tuple[str, str]]:
    """(config key, why) for every setting stock ALBERT cannot express; empty: exportable."""
    out = []
    if cfg.heads.dynamic:
        out.append(("model.heads", f"dynamic head count {cfg.heads.small}/{cfg.heads.large}"))
    if cfg.scales.enabled:
        out.append(("model.scales.windows", "multi-scale windowed heads"))
    if cfg.position != "absolute":
        out.append(("model.position", f"{cfg.position} positions"))
    if cfg.recurrence.enabled:
        out.append(("model.recurrence.mem_len", "segment recurrence"))
    if cfg.fusion.enabled:
        out.append(("model.fusion.enabled", "RPSAN masked fusion"))
    if cfg.memory_tokens:
        out.append(("model.memory_tokens", f"{cfg.memory_tokens} memory tokens"))
    if not cfg.share_layers:
        out.append(("model.share_layers", "unshared layers (this export writes one group)"))
    if cfg.norm != "post":
        out.append(("model.norm", f"{cfg.norm}-LN layers (ALBERT is post-LN)"))
    return out


def check_exportable(cfg: ModelConfig, model_dir: Path) -> None:
    problems = unsupported(cfg)
    if problems:
        keys = "; ".join(f"config key '{k}': {why}" for k, why in problems)
        raise ConfigError(
            f"{model_dir}: stock ALBERT cannot express this model ({keys})",
            "only models with fixed heads, dense attention, absolute positions and post-LN "
            "layers export to Hugging Face; the others load with tibnlp only",
        )


def albert_config(cfg: ModelConfig, vocab: Vocabulary, sop: bool = True) -> dict[str, Any]:
    """`sop`: the model has the sentence-order head (`pretrain.sop`); without, MLM only."""
    return {
        "architectures": ["AlbertForPreTraining" if sop else "AlbertForMaskedLM"],
        "model_type": "albert",
        "vocab_size": cfg.vocab_size,
        "embedding_size": cfg.embedding_size,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_hidden_groups": 1,
        "inner_group_num": 1,
        "num_attention_heads": cfg.heads.small,
        "intermediate_size": cfg.ffn_size,
        "hidden_act": "gelu",  # exact (erf) GELU, as F.gelu
        "hidden_dropout_prob": cfg.dropout,
        "attention_probs_dropout_prob": cfg.attention_dropout,
        "classifier_dropout_prob": cfg.dropout,
        "max_position_embeddings": cfg.max_len,
        "type_vocab_size": 2,
        "initializer_range": cfg.initializer_range,
        "layer_norm_eps": cfg.layer_norm_eps,
        "position_embedding_type": "absolute",
        "pad_token_id": vocab.pad_id,
        "bos_token_id": vocab.cls_id,
        "eos_token_id": vocab.sep_id,
        "tie_word_embeddings": True,
        "dtype": "float32",
    }


def albert_state(cfg: ModelConfig, state: dict[str, torch.Tensor], path: Path) -> dict:
    """Hugging Face tensors from a pretraining state dict (`encoder.*` + MLM head, and the SOP
    head where pretraining had one; the same-document contrast's projection is left behind)."""
    need = ("mlm_bias", "mlm_dense.weight")
    if "rtd_out.weight" in state or any(k.startswith("generator.") for k in state):
        raise DataError(
            f"{path} is an ELECTRA model (pretrain.objective=electra): its discriminator has no "
            "MLM head, and transformers' ALBERT classes need one",
            "export a model pretrained with pretrain.objective=mlm; an ELECTRA encoder is "
            "used by `tibnlp finetune --model` directly",
        )
    if any(k not in state for k in need):
        raise DataError(
            f"{path} holds no MLM/SOP heads (an encoder-only or classifier directory)",
            "export the pretraining output directory (OUTPUT/model of `tibnlp pretrain`)",
        )
    out: dict[str, torch.Tensor] = {}
    d = cfg.hidden_size
    for key, value in state.items():
        value = value.detach().to(torch.float32).contiguous()
        name, _, kind = key.rpartition(".")
        if name == "contrastive_proj":  # a pretraining-only head, as fine-tuning leaves it
            continue
        if key == "mlm_bias":
            out["predictions.bias"] = value
            out["predictions.decoder.bias"] = value.clone()
        elif name in _HEADS:
            out[f"{_HEADS[name]}.{kind}"] = value
        elif name.startswith("encoder."):
            sub = name[len("encoder.") :]
            if sub == f"layer.attention.routes.h{cfg.heads.small}.qkv":
                for i, part in enumerate(("query", "key", "value")):
                    out[f"{LAYER}attention.{part}.{kind}"] = value[i * d : (i + 1) * d].clone()
            elif sub == f"layer.attention.routes.h{cfg.heads.small}.out":
                out[f"{LAYER}attention.dense.{kind}"] = value
            elif sub in _ENCODER:
                out[f"{_ENCODER[sub]}.{kind}"] = value
            else:
                raise DataError(f"{path}: tensor {key} has no ALBERT counterpart")
        else:
            raise DataError(f"{path}: tensor {key} has no ALBERT counterpart")
    return out


def check_shapes(cfg: ModelConfig, state: dict[str, torch.Tensor], model_dir: Path) -> None:
    """Refuse weights that do not fit model.yaml (an edited or swapped file): exported as
    they are, they would give a folder transformers refuses to load, after a "wrote" line."""
    from tibnlp.models.pretraining import AlbertForPretraining

    sop = "sop_classifier.weight" in state
    if bad := shape_mismatches(lambda: AlbertForPretraining(cfg, sop=sop), state, missing=True):
        raise DataError(
            f"{model_dir / WEIGHTS} does not match its model.yaml: {'; '.join(bad[:3])}",
            MISMATCH,
        )


def export_hf(model_dir: Path, output: Path) -> Path:
    """Write `output` (config.json, model.safetensors, tokenizer files) whole or not at all."""
    model_dir, output = Path(model_dir), Path(output)
    if output.resolve().is_relative_to(model_dir.resolve()):  # replaced with the model
        raise DataError(
            f"--output {output} is inside the model directory {model_dir}",
            "choose a folder outside it: a pretraining run replaces its model folder whole",
        )
    check_new_folder(output)  # before any work
    cfg, state = load_pretrained(model_dir)
    check_exportable(cfg, model_dir)
    vocab = Vocabulary.load(model_dir)
    if vocab.size != cfg.vocab_size:
        raise DataError(
            f"{model_dir}: the vocabulary has {vocab.size} pieces, model.yaml {cfg.vocab_size}",
            "the directory mixes two runs; export the directory `tibnlp pretrain` wrote",
        )
    check_vocab_of_weights(model_dir, vocab.sha256, model_dir)
    tensors = albert_state(cfg, state, model_dir / WEIGHTS)  # names a missing head first
    check_shapes(cfg, state, model_dir)
    tokenizer = build_tokenizer(vocab)
    with staged_dir(output) as tmp:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        share(tmp / "model.safetensors")  # save_file makes it private (0600)
        _write_json(
            tmp / "config.json", albert_config(cfg, vocab, "sop_classifier.weight" in state)
        )
        tokenizer.save(str(tmp / "tokenizer.json"))
        _write_json(tmp / "tokenizer_config.json", tokenizer_config(vocab, cfg.max_len))
        _write_json(tmp / "special_tokens_map.json", SPECIAL_TOKENS)
    return output


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
