"""Word vectors for pieces the corpus holds rarely, predicted from their characters (MIMICK).

The pieces that TNCC's training titles lack are rare in the pretraining corpus too
(`benchmarks/corpus_coverage.py`: a median of 15 occurrences for the test titles' pieces that
no training title holds), so their skip-gram vectors rest on a few contexts, or none. Some are
spellings of frequent pieces: a syllable without the word-start mark (`བཀོད` beside
`▁བཀོད`), a syllable glued to a number (`༢༠༡༥ལོ`). Following Pinter et al. (2017, "Mimicking
word embeddings using subword RNNs", here a linear map), a ridge regression from a piece's
character n-grams to its vector is fitted on the pieces the corpus holds often, and a rare
piece's vector becomes (c x its own + k x the predicted) / (c + k), c its corpus count.

    python benchmarks/mimic_vectors.py MODEL OUT --corpus PRETRAIN_OUT [--k 20] [--min-count 100]

MODEL: a model folder whose word embedding is the skip-gram start (e.g. the corpus stage cut
to one step at lr 1e-12, as in `embedding_levers.md`); OUT: a new model folder, a copy with
the blended word embedding; PRETRAIN_OUT: the folder holding `data/dataset` (the corpus the
vectors were trained on). It prints how well the map predicts held-out frequent pieces.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from tibnlp.errors import DataError, run_script
from tibnlp.text.vocab import Vocabulary

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus_coverage import corpus_counts

WORDS = ("encoder.embeddings.word.weight", "embeddings.word.weight")  # pretraining, encoder
START = "\u2581"  # SentencePiece's word-start mark


def ngrams(piece: str, sizes: tuple[int, ...] = (1, 2, 3, 4)) -> list[str]:
    """The piece's character n-grams with boundary marks, and whether it starts a word."""
    start = piece.startswith(START)
    text = "<" + piece.removeprefix(START) + ">"
    grams = [text[i : i + n] for n in sizes for i in range(len(text) - n + 1)]
    return [*grams, "START" if start else "INSIDE"]


def features(pieces: list[str]) -> tuple[object, dict[str, int]]:
    """A sparse [pieces, n-grams] count matrix (scipy CSR) and the n-gram index."""
    from scipy.sparse import csr_matrix

    index: dict[str, int] = {}
    rows, cols = [], []
    for r, piece in enumerate(pieces):
        for g in ngrams(piece):
            rows.append(r)
            cols.append(index.setdefault(g, len(index)))
    data = np.ones(len(rows), dtype=np.float32)
    return csr_matrix((data, (rows, cols)), shape=(len(pieces), len(index))), index


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-9)


def main() -> None:
    from sklearn.linear_model import Ridge

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--k", type=float, default=20.0)
    parser.add_argument("--min-count", type=int, default=100)
    parser.add_argument("--alpha", type=float, default=1.0)
    args = parser.parse_args()
    if args.out.exists():
        raise DataError(f"{args.out} exists", "give a new folder")
    vocab = Vocabulary.load(args.model)
    state = load_file(str(args.model / "model.safetensors"))
    word = next((k for k in WORDS if k in state), None)
    if word is None:
        raise DataError(f"{args.model / 'model.safetensors'} holds no word embedding ({WORDS[0]})")
    table = state[word].float().numpy()
    counts = corpus_counts(args.corpus, vocab.size).astype(np.float64)
    special = set(vocab.special_ids)
    regular = np.array([i not in special for i in range(vocab.size)])
    x, _ = features([vocab.id_to_piece(i) for i in range(vocab.size)])
    frequent = np.flatnonzero(regular & (counts >= args.min_count))
    rng = np.random.default_rng(0)
    held = rng.choice(frequent, size=len(frequent) // 10, replace=False)
    fit = np.setdiff1d(frequent, held)
    mean = table[fit].mean(0)
    check = Ridge(alpha=args.alpha).fit(x[fit], table[fit] - mean)
    predicted = check.predict(x[held]) + mean
    print(
        f"{len(frequent)} pieces held >= {args.min_count} times; on {len(held)} held out, the "
        f"map's cosine to their own vectors: median {np.median(cosine(predicted, table[held])):.3f}"
        f" (a shuffled pairing: {np.median(cosine(predicted, table[rng.permutation(held)])):.3f})"
    )
    model = Ridge(alpha=args.alpha).fit(x[frequent], table[frequent] - mean)
    mimic = model.predict(x) + mean
    rare = regular & (counts < args.min_count)
    c = counts[:, None]
    blended = np.where(rare[:, None], (c * table + args.k * mimic) / (c + args.k), table)
    print(
        f"blended {int(rare.sum())} pieces held < {args.min_count} times "
        f"({int((counts[regular] == 0).sum())} never): k = {args.k:g}"
    )
    shutil.copytree(args.model, args.out)
    state[word] = torch.from_numpy(blended.astype(np.float32)).to(state[word].dtype)
    save_file(state, str(args.out / "model.safetensors"), metadata={"format": "pt"})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    run_script(main)
