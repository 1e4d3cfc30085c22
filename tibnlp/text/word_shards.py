"""The botok segmentation of a prepared corpus, shard by shard in worker processes.

`tibnlp.text.corpus_words` decides what to segment and publishes words/; here is how: the
documents cut into shards of ~`SHARD_CHARS` characters (`plan_shards`), each segmented by a
forked worker into a .npz file of its own, written atomically, so an interruption keeps the
finished ones (`segment_shards`), and the files of a split read back in document order as one
Dataset (`assemble`). Kept apart from the words' folder: the pool, its workers and the shard
file format are one piece of machinery, which the folder's keys and checks do not need.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tibnlp.stopping import ctrl_c_held, die_with_parent
from tibnlp.text.normalize import normalize
from tibnlp.text.syllables import count_syllables
from tibnlp.text.words import WordSegmenter

SHARD_CHARS = 400_000

Progress = Callable[[str], None]
# (split, first doc, end doc, output .npz): one shard for a worker to segment
Job = tuple[str, int, int, str]


def plan_shards(split: str, ds: Any) -> list[tuple[str, int, int, int]]:
    """(split, first doc, end doc, characters) of each shard, documents in order."""
    shards: list[tuple[str, int, int, int]] = []
    start = size = 0
    row = 0
    for batch in ds.select_columns(["sentences"]).iter(batch_size=256):
        for sentences in batch["sentences"]:
            size += sum(len(s) for s in sentences)
            row += 1
            if size >= SHARD_CHARS:
                shards.append((split, start, row, size))
                start, size = row, 0
    if row > start:
        shards.append((split, start, row, size))
    return shards


def shard_file(partial: Path, split: str, first: int) -> Path:
    return partial / f"{split}-{first:08d}.npz"


def shard_figures(path: Path) -> dict[str, float]:
    """What a finished shard file counted (characters, syllables, words) and cost (seconds,
    cpu_seconds)."""
    return dict(json.loads(str(np.load(path)["figures"])))


def segment_shards(
    corpus_dir: Path,
    jobs: list[Job],
    procs: int,
    pack: Path,
    cache: Path,
    todo: int,
    progress: Progress,
) -> None:
    """Segment each job's shard on `procs` forked processes, saying after each how far the
    `todo` characters are (rate, ETA). A stop ends the pool; the shards finished stay."""
    began = time.perf_counter()
    done_chars = done_syl = 0
    WordSegmenter(pack, cache)  # build the trie once, before the workers load it
    ctx = multiprocessing.get_context("fork")
    args = (str(corpus_dir), str(pack), str(cache), die_with_parent())
    with contextlib.ExitStack() as stack:
        with ctrl_c_held():  # (a Ctrl-C meanwhile: delivered once the pool can be ended)
            pool = stack.enter_context(ctx.Pool(procs, initializer=_init_worker, initargs=args))
        for n, fig in enumerate(pool.imap_unordered(_segment_shard, jobs), 1):
            done_chars += int(fig["characters"])
            done_syl += int(fig["syllables"])
            spent = time.perf_counter() - began
            rate = done_chars / spent
            eta = (todo - done_chars) / rate if rate else 0.0
            progress(
                f"botok words: shard {n}/{len(jobs)}, {done_chars:,}/{todo:,} characters, "
                f"{rate:,.0f} chars/s, {done_syl / spent:,.0f} syllables/s, "
                f"ETA {max(eta, 0.0) / 60:.1f} min"
            )


# One segmenter and one corpus per worker process, made by the pool's initializer.
_WORKER: dict[str, Any] = {}


def _init_worker(
    corpus_dir: str, pack: str, cache: str, arm: Callable[[], None] | None = None
) -> None:
    from tibnlp.text.prepared import load_prepared

    # A Ctrl-C reaches the whole process group: the parent's ends the pool (keeping the
    # finished shards) and says so; each worker's own was a traceback burying that line
    # (one reaching it before this line is held: `ctrl_c_held`).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if arm is not None:  # and a parent gone without ending the pool (SIGKILL) ends them too
        arm()
    _WORKER["corpus"] = load_prepared(Path(corpus_dir))
    _WORKER["segmenter"] = WordSegmenter(Path(pack), Path(cache))


def _segment_shard(job: Job) -> dict[str, float]:
    """Segment documents [first, end) of a split into one .npz (written atomically)."""
    split, first, end, out = job
    seg: WordSegmenter = _WORKER["segmenter"]
    began, cpu = time.perf_counter(), time.process_time()
    doc_sentences, sentence_words, starts = [], [], []
    chars = syllables = words = 0
    for sentences in _WORKER["corpus"][split].select(range(first, end))["sentences"]:
        doc_sentences.append(len(sentences))
        for sentence in sentences:
            text = normalize(sentence)
            offsets, n_words = seg.segment(text)
            sentence_words.append(len(offsets))
            starts.extend(offsets)
            chars += len(text)
            syllables += count_syllables(text)
            words += n_words
    figures = {
        "characters": chars,
        "syllables": syllables,
        "words": words,
        "seconds": time.perf_counter() - began,
        "cpu_seconds": time.process_time() - cpu,  # the cost on a shared machine
    }
    tmp = Path(f"{out}.tmp.npz")
    np.savez(
        tmp,
        doc_sentences=np.asarray(doc_sentences, dtype=np.int64),
        sentence_words=np.asarray(sentence_words, dtype=np.int64),
        starts=np.asarray(starts, dtype=np.int32),
        figures=json.dumps(figures),
    )
    os.replace(tmp, out)
    return figures


def assemble(files: list[Path]) -> Any:
    """One split's shards, in document order, as a Dataset with column `word_starts`. Its
    fingerprint (state.json) is `datasets`' hash of this in-memory table: of the content, as
    words/ must be (`tibnlp.text.corpus_words`), unlike a Dataset read from a file
    (`content_fingerprint`)."""
    import datasets
    import pyarrow as pa

    parts = [np.load(f) for f in files]
    docs = np.concatenate([p["doc_sentences"] for p in parts]) if parts else np.zeros(0, int)
    sents = np.concatenate([p["sentence_words"] for p in parts]) if parts else np.zeros(0, int)
    flat = np.concatenate([p["starts"] for p in parts]) if parts else np.zeros(0, np.int32)
    inner = pa.ListArray.from_arrays(
        pa.array(np.concatenate([[0], np.cumsum(sents)]), pa.int32()), pa.array(flat, pa.int32())
    )
    outer = pa.ListArray.from_arrays(
        pa.array(np.concatenate([[0], np.cumsum(docs)]), pa.int32()), inner
    )
    table = pa.table({"word_starts": outer})
    features = datasets.Features(
        {"word_starts": datasets.Sequence(datasets.Sequence(datasets.Value("int32")))}
    )
    return datasets.Dataset(table).cast(features)
