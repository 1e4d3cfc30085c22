"""A pin on what the pretrain stage trains on, so that a change to it cannot reach users' caches
silently: the pipeline reuses a cached stage output by the hash of its settings and inputs,
and only `tibnlp.pipeline.cache.OUTPUT_REVISION` tells it that the code now writes something
else (a stale corpus stage was reused this way before 659a990's layout fix had a revision)."""

from __future__ import annotations

import hashlib
import json
import random
from types import SimpleNamespace

from tibnlp.data.sop_examples import make_examples
from tibnlp.pipeline.cache import OUTPUT_REVISION

# revision of the pretrain stage -> the examples' digest (pair task on, then off)
PINNED = {2: ("2d1428aa903037b6", "771e86e2e3124fa1")}


def _starts(ids: list[int]) -> list[bool]:
    return [i % 2 == 0 for i in range(len(ids))]


def _digest(pairs: bool) -> str:
    vocab = SimpleNamespace(cls_id=2, sep_id=3, syllable_starts=_starts)
    docs = [
        [[5 + (d * 7 + s * 3 + i) % 40 for i in range(3 + (d + s) % 9)] for s in range(1 + d % 5)]
        for d in range(12)
    ]
    rng = random.Random(0)
    sop = 0.5 if pairs else 0.0
    out = [
        example
        for d, sentences in enumerate(docs)
        for example in make_examples(d, sentences, vocab, 16, rng, 0.1, sop, pairs=pairs)  # type: ignore[arg-type]
    ]
    return hashlib.sha256(json.dumps(out, sort_keys=True).encode()).hexdigest()[:16]


def test_pretraining_examples_match_the_pretrain_stages_output_revision() -> None:
    revision = OUTPUT_REVISION.get("pretrain", 1)
    found = (_digest(pairs=True), _digest(pairs=False))
    assert PINNED.get(revision) == found, (
        f"the pretraining examples changed (digests {found}): cached pretrain stages would be "
        "reused with the old examples. Raise OUTPUT_REVISION['pretrain'] in "
        f"tibnlp/pipeline/cache.py and pin the new digests here as revision {revision + 1}; "
        "if the change is not meant to alter the examples, fix it instead"
    )
