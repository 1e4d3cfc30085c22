"""Which settings define what a stage writes.

The pipeline cache key (`tibnlp.pipeline.cache.node_key`) and the fine-tuning seed fingerprint
both hash `output_settings`, so a cached output is reused only when rerunning would write the
same thing: a precision switch reruns, a log-cadence or thread-count switch does not.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tibnlp.config import Config
from tibnlp.config.core import to_dict

# How fast or how loudly a stage runs, never what it writes: pinned to their defaults in the
# hash (not removed, so keys made before they were singled out stay valid).
OUTPUT_NEUTRAL = frozenset(
    {
        "pretrain.log_every",  # MLflow cadence of the training metrics
        "pretrain.warn_after",  # when a "not learning" warning is logged
        "corpus.num_proc",  # worker processes; the map is deterministic per batch
        # Not promised bit-neutral: a thread count may change the order of float reductions,
        # so runs at two counts can differ in rounding. Kept neutral on purpose: the same
        # recipe on the same data, and a cache hit should not depend on the machine's cores.
        "engine.threads",
        "engine.num_workers",  # tokenising processes; same examples
        "engine.backend",
        "engine.port",
    }
)

# Sections and settings that entered the hash later: present only where they differ from
# their defaults, so a stage run with the default engine (or without init_from) keeps the key
# it had before.
ADDED_WHEN_SET = frozenset(
    {
        "engine",
        "pretrain.init_from",
        "pretrain.objective",
        "pretrain.generator_ratio",
        "pretrain.rtd_weight",
        "pretrain.skipgram",
        "pretrain.skipgram.ngram_buckets",  # (a setting inside a set section, as well)
        "pretrain.skipgram.ngram_min",
        "pretrain.skipgram.ngram_max",
        "pretrain.word_lr",
        "pretrain.contrastive",
        "pretrain.contrastive_temperature",
        "pretrain.mask_rarity",
        "finetune.layer_decay",
        "finetune.mlm_weight",
        "finetune.mlm_prob",
        "finetune.probe_epochs",
        "finetune.probe_lr",
        "finetune.static_vectors",
        "finetune.class_balance",
        "finetune.soup",
        "finetune.adversarial",
        "finetune.subword_alpha",
        "finetune.subword_nbest",
        "finetune.l2sp",
        "finetune.input_mask",
        "vocab.punctuation_pieces",
        "vocab.whole_units",
    }
)


def output_settings(
    config: dict[str, Any], sections: Iterable[str], pinned: Iterable[str] = ()
) -> dict[str, Any]:
    """`config` (a full `to_dict(Config)`) reduced to `sections`, as it enters a hash.
    `pinned`: more "section.name" keys held at their defaults, as `OUTPUT_NEUTRAL` (a pipeline
    stage's own paths, which it sets itself); a config that sets none keeps its hash."""
    defaults = to_dict(Config())
    neutral = OUTPUT_NEUTRAL | set(pinned)
    out: dict[str, Any] = {}
    for section in sections:
        values = dict(config[section])
        for name in list(values):
            if f"{section}.{name}" in neutral:
                values[name] = defaults[section][name]
            added = section in ADDED_WHEN_SET or f"{section}.{name}" in ADDED_WHEN_SET
            if added and values[name] == defaults[section][name]:
                del values[name]
            elif isinstance(values[name], dict):  # settings added later inside a nested one
                values[name] = {
                    sub: value
                    for sub, value in values[name].items()
                    if f"{section}.{name}.{sub}" not in ADDED_WHEN_SET
                    or value != defaults[section][name][sub]
                }
        if section == "finetune" and values.get("head") == "cnn":
            # pooling's default became "auto" (was "cls"); the CNN head never reads it, so
            # its fine-tunings keep the key they had
            values["pooling"] = "cls"
        if section in ADDED_WHEN_SET and not values:
            continue
        out[section] = values
    return out
