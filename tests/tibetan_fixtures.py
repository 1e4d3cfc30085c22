"""Tiny prepared corpora in the `tibnlp corpus prepare` layout, for vocabulary and data tests."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import yaml

ROOTS = "ཀཁགངཅཆཇཉཏཐདནཔཕབམཙཚཛཝཞཟའཡརལཤསཧ"
VOWELS = ["", "ི", "ུ", "ེ", "ོ"]
SUFFIXES = ["", "ག", "ང", "ད", "ན", "བ", "མ", "ར", "ལ", "ས"]


def syllable(rng: random.Random) -> str:
    return rng.choice(ROOTS) + rng.choice(VOWELS) + rng.choice(SUFFIXES)


def sentence(rng: random.Random, words: list[str]) -> str:
    """1-3 clauses of words (1-3 syllables, Zipf-ish) joined by tsheg, each closed by shad."""
    weights = [1.0 / (rank + 1) for rank in range(len(words))]
    clauses = ["་".join(rng.choices(words, weights, k=rng.randint(2, 6))) + "།"]
    clauses += [
        "་".join(rng.choices(words, weights, k=rng.randint(2, 6))) + "།"
        for _ in range(rng.randint(0, 2))
    ]
    return " ".join(clauses)


def write_prepared(
    path: Path, n_docs: int = 120, seed: int = 0, empty: bool = False, heldout: int = 10
) -> Path:

    rng = random.Random(seed)
    words = ["་".join(syllable(rng) for _ in range(rng.choice([1, 1, 2, 3]))) for _ in range(400)]
    docs = [
        {
            "doc_id": i,
            "source": "synthetic",
            "sentences": [] if empty else [sentence(rng, words) for _ in range(rng.randint(1, 12))],
        }
        for i in range(n_docs)
    ]
    return save_prepared(path, docs, heldout, {"documents": n_docs, "seed": seed})


def save_prepared(
    path: Path, docs: list[dict[str, Any]], heldout: int, report: dict[str, Any]
) -> Path:
    """Save `docs` in the layout `tibnlp corpus prepare` writes: the first `heldout` documents
    are the held-out split, the rest train."""
    import datasets

    features = datasets.Features(
        {
            "doc_id": datasets.Value("int64"),
            "source": datasets.Value("string"),
            "sentences": datasets.Sequence(datasets.Value("string")),
        }
    )
    dd = datasets.DatasetDict(
        train=datasets.Dataset.from_list(docs[heldout:], features=features),
        heldout=datasets.Dataset.from_list(docs[:heldout], features=features),
    )
    path.mkdir(parents=True, exist_ok=True)
    dd.save_to_disk(str(path / "dataset"))
    (path / "tibnlp-corpus.json").write_text(json.dumps({"kind": "prepared_corpus", "version": 1}))
    (path / "report.json").write_text(json.dumps(report))
    return path


def prepared_inputs(
    root: Path, n_docs: int = 200, heldout: int = 20, vocab_size: int = 200
) -> Path:
    """`root/corpus` (a prepared corpus, as `tibnlp corpus prepare` writes it) and `root/vocab`
    (its vocabulary, built as `tibnlp vocab build` builds it): the inputs of pretraining."""
    from tibnlp.config import VocabConfig
    from tibnlp.text.vocab_build import build_vocabulary

    corpus = write_prepared(root / "corpus", n_docs=n_docs, heldout=heldout)
    build_vocabulary(corpus, root / "vocab", VocabConfig(vocab_size=vocab_size, num_threads=1))
    return root


# the model shape of the pretraining tests: a forward and backward take milliseconds
TINY_MODEL: dict[str, Any] = {
    "embedding_size": 16,
    "hidden_size": 32,
    "num_layers": 1,
    "ffn_size": 64,
    "max_len": 64,
    "heads": {"small": 2, "large": 4},
}

# A one-layer MLM-only pretraining of a few steps: a run's outputs for tests that read them.
TINY_MLM_RUN: dict[str, dict[str, Any]] = {
    "model": dict(TINY_MODEL),
    "pretrain": {"seq_len": 32, "batch_size": 8, "max_steps": 2, "sop": False},
    "engine": {"threads": 1},
}


def pretrain_config_file(
    inputs: Path,
    out: Path,
    sections: dict[str, dict[str, Any]],
    experiment: str = "",
    name: str = "",
    **pretrain: Any,
) -> Path:
    """A pretraining config file beside `out`: `sections` (copied) with `pretrain` pointed at
    `inputs`' corpus and vocabulary (`prepared_inputs`) and at `out`, then `pretrain`'s
    overrides; tracked to `mlflow.db` beside `out`."""
    data = {k: dict(v) for k, v in sections.items()}
    data["pretrain"] = {
        **data.get("pretrain", {}),
        "corpus": str(inputs / "corpus"),
        "vocab": str(inputs / "vocab"),
        "output": str(out),
        **pretrain,
    }
    data["tracking"] = {"uri": f"sqlite:///{out.parent / 'mlflow.db'}"}
    if experiment:
        data["tracking"]["experiment"] = experiment
    path = out.parent / (name or f"{out.name}.yaml")
    path.write_text(yaml.safe_dump(data))
    return path
