"""Are the pieces that TNCC's training titles hold rarely also rare in the pretraining corpus?

The encoder's lead over its random-init twin lives in titles whose pieces the training titles
hold rarely or never (`benchmarks/gain_by_rarity.py`, `lead_by_rarity.md`). A lever that
builds vectors for pieces rare in the corpus (fastText's character n-grams, say) can only help
there if those pieces are rare in the corpus too. This script counts, for every piece
occurrence in the test (or validation) titles, how many training titles hold that piece and
how many times the pretraining corpus holds it, and reports the corpus counts by the
training-title bucket of `gain_by_rarity.py`.

    python benchmarks/corpus_coverage.py PRETRAIN_OUT --vocab MODEL [--part test]

PRETRAIN_OUT: a pretraining output's model folder (the one holding `data/dataset`, the
tokenised corpus it trained on); MODEL: a folder holding the vocabulary of both.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from tibnlp.data.tasks import load_tncc
from tibnlp.errors import DataError, run_script
from tibnlp.text.vocab import Vocabulary

EDGES = (0, 1, 5, 20)  # as gain_by_rarity.py: training titles holding the piece
CORPUS_CUTS = (5, 20, 100)  # corpus occurrences


def corpus_counts(pretrain_out: Path, size: int) -> np.ndarray:
    """Occurrences of each piece id in the tokenised train split of the corpus."""
    import datasets

    folder = pretrain_out / "data" / "dataset"
    if not folder.is_dir():
        raise DataError(
            f"{folder} does not exist",
            "give the folder `tibnlp pretrain` wrote (pretrain.output: it holds data/ and model/)",
        )
    counts = np.zeros(size, dtype=np.int64)
    for batch in datasets.load_from_disk(str(folder))["train"].iter(batch_size=4096):
        for ids in batch["input_ids"]:
            counts += np.bincount(ids, minlength=size)[:size]
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pretrain_out", type=Path)
    parser.add_argument("--vocab", type=Path, required=True)
    parser.add_argument("--part", default="test", choices=["test", "validation"])
    args = parser.parse_args()
    vocab = Vocabulary.load(args.vocab)
    corpus = corpus_counts(args.pretrain_out, vocab.size)
    data = load_tncc("title")
    special = set(vocab.special_ids) - {vocab.unk_id}
    train_df = np.zeros(vocab.size, dtype=np.int64)
    for text in data.texts("train"):
        for piece in set(vocab.encode(text)) - special:
            train_df[piece] += 1
    pieces = np.array(
        [p for t in data.texts(args.part) for p in vocab.encode(t) if p not in special]
    )
    bucket = np.searchsorted(np.asarray(EDGES), train_df[pieces], side="right") - 1
    print(f"{args.part} title pieces: {len(pieces)}; corpus: {int(corpus.sum()):,} pieces")
    head = " | ".join(f"corpus < {c}" for c in CORPUS_CUTS)
    print(f"| training titles holding the piece | occurrences | {head} | median corpus count |")
    print("|---|---:|" + "---:|" * len(CORPUS_CUTS) + "---:|")
    for i, lo in enumerate(EDGES):
        hi = f"-{EDGES[i + 1] - 1}" if i + 1 < len(EDGES) else " or more"
        sel = corpus[pieces[bucket == i]]
        if not len(sel):
            continue
        shares = " | ".join(f"{100 * float((sel < c).mean()):.1f} %" for c in CORPUS_CUTS)
        name = "0" if lo == 0 else f"{lo}{hi}"
        print(f"| {name} | {len(sel)} | {shares} | {int(np.median(sel)):,} |")


if __name__ == "__main__":
    run_script(main)
