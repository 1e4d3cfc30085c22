"""Tokenisation of a prepared corpus into ids: `Vocabulary.encode_batch` against sentencepiece
called directly in a plain Python loop (one `encode` per sentence), same sentences, same run.

Both normalise with `tibnlp.text.vocab.normalize` and encode with the same model (the
syllable rule is inside spm.model), so the ids must agree; the ratio is the speed-up of the
batch path (C++ threads, one call per batch). The same comparison on pre-normalised text
isolates SentencePiece. Throughput is in syllables per second.

    python benchmarks/bench_tokenize.py --corpus DIR --vocab DIR [--limit N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from tibnlp.text.syllables import count_syllables
from tibnlp.text.vocab import Vocabulary, normalize
from tibnlp.text.vocab_build import load_corpus


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--vocab", type=Path, required=True)
    parser.add_argument("--limit", type=int, default=0, help="sentences (0: all of train)")
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    vocab = Vocabulary.load(args.vocab)
    sentences = [s for doc in load_corpus(args.corpus)["train"]["sentences"] for s in doc]
    if args.limit:
        sentences = sentences[: args.limit]
    n_syll = sum(count_syllables(s) for s in sentences)

    start = time.perf_counter()
    batched = []
    for i in range(0, len(sentences), args.batch):
        batched.extend(vocab.encode_batch(sentences[i : i + args.batch]))
    t_batch = time.perf_counter() - start

    sp = vocab.sp
    start = time.perf_counter()
    looped = [sp.encode(normalize(s)) for s in sentences]
    t_loop = time.perf_counter() - start
    assert batched == looped, "the two paths disagree"

    # The same two paths on pre-normalised text: SentencePiece alone, without our normaliser.
    normalised = [normalize(s) for s in sentences]
    start = time.perf_counter()
    for i in range(0, len(normalised), args.batch):
        sp.encode(normalised[i : i + args.batch], num_threads=-1)
    t_sp_batch = time.perf_counter() - start
    start = time.perf_counter()
    for s in normalised:
        sp.encode(s)
    t_sp_loop = time.perf_counter() - start

    result = {
        "sentences": len(sentences),
        "syllables": n_syll,
        "tokens": sum(len(x) for x in batched),
        "cpus": os.cpu_count(),
        "load_avg": os.getloadavg(),
        "encode_batch_s": round(t_batch, 2),
        "python_loop_s": round(t_loop, 2),
        "encode_batch_syll_per_s": round(n_syll / t_batch),
        "python_loop_syll_per_s": round(n_syll / t_loop),
        "speedup": round(t_loop / t_batch, 2),
        "prenormalised_batch_syll_per_s": round(n_syll / t_sp_batch),
        "prenormalised_loop_syll_per_s": round(n_syll / t_sp_loop),
        "prenormalised_speedup": round(t_sp_loop / t_sp_batch, 2),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
