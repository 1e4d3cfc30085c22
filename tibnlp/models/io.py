"""Model directories: `model.safetensors` + `model.yaml`, the unit that `finetune --model` reads.

Weights are stored with safetensors only, so loading never unpickles. `model.yaml` is the
`ModelConfig` with a numeric head threshold, so fine-tuning routes exactly as pretraining did.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors import SafetensorError
from safetensors.torch import safe_open, save_file
from torch import nn

from tibnlp.config.core import from_dict, to_dict
from tibnlp.config.model import ModelConfig, drop_moved_keys
from tibnlp.errors import ConfigError, DataError
from tibnlp.fsutil import atomic_file, atomic_write_text
from tibnlp.models.attention import numeric_threshold
from tibnlp.models.encoder import Encoder

WEIGHTS = "model.safetensors"
CONFIG = "model.yaml"
ENCODER_PREFIX = "encoder."
DEPTH_KEY = "tibnlp_depth"  # safetensors metadata: the depth the weights were trained at
MISMATCH = "the folder mixes two models: use the folder `tibnlp pretrain` wrote, unedited"


def build_encoder(cfg: ModelConfig) -> Encoder:
    """A freshly initialised encoder; raises ConfigError if a dynamic threshold is 'auto'."""
    return Encoder(cfg)


def save_pretrained(
    model: nn.Module, cfg: ModelConfig, out_dir: Path, extra: dict[str, Any] | None = None
) -> Path:
    """Write weights then config, each through a temp file and rename (never half-written).

    `extra` (JSON-serialisable, e.g. step or vocabulary name) goes into the safetensors
    metadata; read it back with `read_extra`.
    """
    if cfg.heads.dynamic:
        numeric_threshold(cfg.heads)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    meta = {
        "format": "pt",
        "tibnlp_extra": json.dumps(extra or {}),
        DEPTH_KEY: json.dumps(_depth(cfg)),
    }
    with atomic_file(out_dir / WEIGHTS) as tmp:
        save_file(state, str(tmp), metadata=meta)
    text = yaml.safe_dump(to_dict(cfg), sort_keys=False, allow_unicode=True)
    atomic_write_text(out_dir / CONFIG, text)
    return out_dir


def _depth(cfg: ModelConfig) -> dict[str, Any]:
    """What the tensors cannot tell: shared layers hold one layer's weights for any depth."""
    return {"num_layers": cfg.num_layers, "share_layers": cfg.share_layers}


def _check_depth(cfg: ModelConfig, path: Path, meta: dict[str, str]) -> None:
    """A model.yaml edited to another depth than the weights were trained at is refused
    (weights saved before the depth was recorded pass)."""
    try:
        recorded = json.loads(meta[DEPTH_KEY])
    except (KeyError, ValueError):
        return
    if isinstance(recorded, dict) and recorded != _depth(cfg):
        said = ", ".join(f"{k}: {v}" for k, v in _depth(cfg).items())
        saved = ", ".join(f"{k}: {v}" for k, v in recorded.items())
        raise DataError(
            f"{path} does not match its {CONFIG}: the weights were trained with {saved}, "
            f"the {CONFIG} says {said}",
            MISMATCH,
        )


def load_config_file(model_dir: Path) -> ModelConfig:
    path = Path(model_dir) / CONFIG
    if not path.is_file():
        inside = Path(model_dir) / "model" / CONFIG  # a pretraining run's folder, not its model
        hint = (
            f"use {inside.parent}, the model that run saved"
            if inside.is_file()
            else "name a saved model directory (a pretraining run's OUTPUT/model, or an export "
            "under OUTPUT/exports/)"
        )
        hint = _other_folder(Path(model_dir)) or hint
        classifier = Path(model_dir) / "classifier.yaml"  # a fine-tuned seed's folder
        if classifier.is_file():
            source = _source_model(classifier)
            hint = "it is a fine-tuned classifier (for `tibnlp predict --model`); " + (
                f"it was fine-tuned from {source}" if source else "it was trained without one"
            )
        raise DataError(f"{path} does not exist: {model_dir} is not a saved model directory", hint)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):  # empty or cut short: not a model of default shape
            what = "empty" if data is None else type(data).__name__
            raise DataError(
                f"{path} holds no model settings ({what})",
                "the directory is damaged: use the run's saved copy or train it again",
            )
        return from_dict(ModelConfig, drop_moved_keys(data), "model")
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise DataError(f"{path} is not a readable model config ({exc})") from exc
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc.message}", exc.hint) from exc


def _other_folder(folder: Path) -> str:
    """A hint for a checkpoint or a Hugging Face export given where a model folder goes."""
    for checkpoints in (folder, folder.parent):  # OUTPUT/checkpoints or one of its tags
        if checkpoints.name == "checkpoints" and (checkpoints / "latest").is_file():
            return (
                f"it holds DeepSpeed checkpoints, read by `pretrain --resume`; the run's "
                f"model is {checkpoints.parent / 'model'}"
            )
    if (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file():
        return "it is a Hugging Face export (for transformers); give the folder it came from"
    return ""


def _source_model(classifier_yaml: Path) -> str:
    """The pretrained model a classifier was fine-tuned from ("" when none, or unreadable)."""
    try:
        meta = yaml.safe_load(classifier_yaml.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError):
        return ""
    return str(meta.get("source_model") or "") if isinstance(meta, dict) else ""


def load_pretrained(model_dir: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """The config and the raw state dict (keys as saved) of a model directory."""
    cfg = load_config_file(model_dir)
    path = Path(model_dir) / WEIGHTS
    if not path.is_file():
        raise DataError(f"{path} does not exist", "the directory holds no saved weights")
    try:
        with safe_open(path, framework="pt") as fh:  # the tensors and the metadata, one open
            meta = fh.metadata() or {}
            state = {key: fh.get_tensor(key) for key in fh.keys()}  # noqa: SIM118 (no __iter__)
    except (SafetensorError, OSError, ValueError) as exc:
        raise DataError(f"{path} is corrupt or not a safetensors file ({exc})") from exc
    _check_depth(cfg, path, meta)
    return cfg, state


def read_extra(model_dir: Path) -> dict[str, Any]:
    """The `extra` mapping given to `save_pretrained`."""
    path = Path(model_dir) / WEIGHTS
    try:
        with safe_open(path, framework="pt") as fh:
            meta = fh.metadata() or {}
    except (SafetensorError, OSError, ValueError) as exc:
        raise DataError(f"{path} is missing or corrupt ({exc})") from exc
    result: dict[str, Any] = json.loads(meta.get("tibnlp_extra", "{}"))
    return result


def check_vocab_of_weights(model_dir: Path, vocab_sha256: str, vocab_dir: Path) -> None:
    """Refuse a vocabulary other than the one the weights were pretrained with (the
    `vocab_sha256` pretraining records in them): another run's vocabulary of the same or a
    smaller size would load and train, every id naming another piece than it did."""
    try:
        recorded = read_extra(Path(model_dir)).get("vocab_sha256")
    except DataError:  # no weights file: a random-init twin reads only the shape
        return
    if isinstance(recorded, str) and recorded and recorded != vocab_sha256:
        raise DataError(
            f"{vocab_dir}: the vocabulary (sha256 {vocab_sha256[:12]}) is not the one the "
            f"weights in {Path(model_dir) / WEIGHTS} were pretrained with ({recorded[:12]})",
            "the folder mixes two runs: use the folder `tibnlp pretrain` wrote, with its own "
            "spm.model, spm.vocab, tibnlp-vocab.json and vocab.yaml",
        )


def shape_mismatches(
    build: Callable[[], nn.Module],
    state: dict[str, torch.Tensor],
    prefix: str = "",
    missing: bool = False,
) -> list[str]:
    """Tensors of `state` (keys `prefix` + the built module's) whose shape is not the one
    `build()` gives, and with `missing` the module's keys `state` lacks: an edited or swapped
    model.yaml named before a run writes anything, not by a load_state_dict traceback."""
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        want = build().state_dict()
    bad = [
        f"{prefix}{k} {list(state[prefix + k].shape)} (model.yaml: {list(v.shape)})"
        for k, v in want.items()
        if prefix + k in state and state[prefix + k].shape != v.shape
    ]
    return bad + [f"{prefix}{k} missing" for k in want if missing and prefix + k not in state]


def encoder_mismatches(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> list[str]:
    """`shape_mismatches` of the encoder (keys with or without `encoder.`)."""
    prefix = ENCODER_PREFIX if any(k.startswith(ENCODER_PREFIX) for k in state) else ""
    return shape_mismatches(lambda: build_encoder(cfg), state, prefix)


def load_encoder(model_dir: Path) -> tuple[ModelConfig, Encoder]:
    """An `Encoder` with the saved weights, from a pretraining or an encoder-only directory."""
    cfg, state = load_pretrained(model_dir)
    if any(k.startswith(ENCODER_PREFIX) for k in state):
        state = {
            k[len(ENCODER_PREFIX) :]: v for k, v in state.items() if k.startswith(ENCODER_PREFIX)
        }
    where = f"{Path(model_dir) / WEIGHTS} does not match its {CONFIG}"
    if bad := encoder_mismatches(cfg, state):  # (model.yaml edited, or another model's)
        raise DataError(f"{where}: {'; '.join(bad[:3])}", MISMATCH)
    encoder = build_encoder(cfg)
    missing, unexpected = encoder.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise DataError(  # (another depth or layer sharing: tensors, not shapes, differ)
            f"{where}: missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}",
            MISMATCH,
        )
    return cfg, encoder
