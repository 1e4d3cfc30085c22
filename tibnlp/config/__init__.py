"""One configuration for the whole toolkit: a root dataclass with one section per component.

`load_config(path, overrides)` reads a YAML file (any subset of sections) and `--set` overrides
on top of the defaults and validates everything at once. Section dataclasses live beside this
file, one module per component; the machinery is in `core`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tibnlp.config.core import (
    apply_overrides,
    check,
    dump_yaml,
    flatten,
    from_dict,
    load,
    to_dict,
)
from tibnlp.config.finetune import FinetuneConfig
from tibnlp.config.model import HeadsConfig, ModelConfig, ScalesConfig
from tibnlp.config.text import CorpusConfig, VocabConfig
from tibnlp.config.tracking import TrackingConfig
from tibnlp.config.train import EngineConfig, OptimizerConfig, PretrainConfig


@dataclass
class Config:
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    vocab: VocabConfig = field(default_factory=VocabConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def validate(self, prefix: str) -> None:
        # LAMB's trust ratio is per weight tensor; ZeRO 1 and 2 hand the optimizer flat shards
        # of many tensors, which would make it one ratio per shard (DeepSpeed refuses it as an
        # untested ZeRO optimizer, deep inside the engine's start)
        for section in ("pretrain", "finetune"):
            name = getattr(self, section).optimizer.name
            check(
                not (name == "lamb" and self.engine.zero_stage > 0),
                f"{section}.optimizer.name",
                f"lamb runs with engine.zero_stage 0 only (here {self.engine.zero_stage}): its "
                "per-tensor trust ratio needs whole tensors, and ZeRO hands it flat shards. Set "
                "engine.zero_stage: 0 (an ALBERT-tiny's optimizer state is a few MB, nothing "
                "to shard) or optimizer.name: adamw",
            )


def load_config(path: Path | None = None, overrides: Iterable[str] = ()) -> Config:
    """Defaults <- YAML file <- `--set` overrides, validated."""
    return load(Config, path, overrides)


__all__ = [
    "Config",
    "CorpusConfig",
    "EngineConfig",
    "FinetuneConfig",
    "HeadsConfig",
    "ModelConfig",
    "OptimizerConfig",
    "PretrainConfig",
    "ScalesConfig",
    "TrackingConfig",
    "VocabConfig",
    "apply_overrides",
    "check",
    "dump_yaml",
    "flatten",
    "from_dict",
    "load_config",
    "to_dict",
]
