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
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from tibnlp.errors import run_script
from tibnlp.fsutil import atomic_write_text
from tibnlp.text.prepared import load_prepared
from tibnlp.text.syllables import count_syllables
from tibnlp.text.vocab import Vocabulary, normalize


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--vocab", type=Path, required=True)
    parser.add_argument("--limit", type=int, default=0, help="sentences (0: all of train)")
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (median)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    vocab = Vocabulary.load(args.vocab)
    sentences = [s for doc in load_prepared(args.corpus)["train"]["sentences"] for s in doc]
    if args.limit:
        sentences = sentences[: args.limit]
    n_syll = sum(count_syllables(s) for s in sentences)

    sp = vocab.sp
    normalised = [normalize(s) for s in sentences]  # pre-normalised: SentencePiece alone

    def batch_path() -> list[list[int]]:
        out: list[list[int]] = []
        for i in range(0, len(sentences), args.batch):
            out.extend(vocab.encode_batch(sentences[i : i + args.batch]))
        return out

    def loop_path() -> list[list[int]]:
        return [sp.encode(normalize(s)) for s in sentences]

    def sp_batch_path() -> None:
        for i in range(0, len(normalised), args.batch):
            sp.encode(normalised[i : i + args.batch], num_threads=-1)

    def sp_loop_path() -> None:
        for s in normalised:
            sp.encode(s)

    batched = batch_path()
    assert batched == loop_path(), "the two paths disagree"  # also the warm-up, untimed
    paths: dict[str, Callable[[], object]] = {
        "batch": batch_path,
        "loop": loop_path,
        "sp_batch": sp_batch_path,
        "sp_loop": sp_loop_path,
    }
    times: dict[str, list[float]] = {k: [] for k in paths}
    for r in range(args.rounds):  # alternating order, so load drift hits every path alike
        for name in list(paths) if r % 2 == 0 else list(reversed(paths)):
            start = time.perf_counter()
            paths[name]()
            times[name].append(time.perf_counter() - start)
    t_batch, t_loop, t_sp_batch, t_sp_loop = (statistics.median(times[k]) for k in paths)

    result = {
        "sentences": len(sentences),
        "syllables": n_syll,
        "tokens": sum(len(x) for x in batched),
        "cpus": os.cpu_count(),
        "load_avg": os.getloadavg(),
        "rounds": args.rounds,
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
        atomic_write_text(args.json, text)


if __name__ == "__main__":
    run_script(main)
