"""`tibnlp corpus words`: the botok words of a prepared corpus, found once and stored with it.

Whole-word masking needs word boundaries, and segmenting is the slow part (botok runs some
tens of thousands of characters per second per core: benchmarks/results/wwm.md). It depends
only on the corpus and the dialect pack, not on the vocabulary or `seq_len`, so it is a
preparation step whose result lives in the prepared corpus itself:

    CORPUS/words/train, CORPUS/words/heldout   datasets.Dataset, row-aligned with the corpus
                                               split, column `word_starts` (per sentence, the
                                               UTF-8 byte offsets of its botok tokens in the
                                               normalised sentence: `tibnlp.text.words`)
    CORPUS/words/meta.json                     what the words are: key (corpus content,
                                               pack digest, botok version) and figures
    CORPUS/words/.words-run.json               how this copy was made: the pack's path,
                                               num_proc, shards (resumed ones), seconds

All but the hidden run file are the same bytes for the same corpus, pack content and botok
version, whatever the process count, the time taken or the pack's folder: the pipeline hashes
a corpus folder given as input by content (`path_hash`, which passes over hidden files), and
a re-preparation with words must find its caches again (as `tibnlp.text.prepare`'s run file).
Words found before the run file existed held the run facts in meta.json under the same key:
kept, they are moved to the run file once (`_migrate`), so such a folder hashes as a new one.

Work is cut into shards of contiguous documents (`tibnlp.text.word_shards`: ~`SHARD_CHARS`
characters each), segmented by `num_proc` processes; each finished shard is written at once
under CORPUS/.words.partial/, so an interrupted run resumes from the shards it has (shards of
another key are discarded). A progress line (shards, characters/s, syllables/s, ETA) goes to
stderr as shards finish; `words/` is published whole at the end. Pretraining reads it with
`load_words`, which needs neither botok nor the pack.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from tibnlp.errors import DataError
from tibnlp.fsutil import atomic_write_text, staged_dir
from tibnlp.text.word_shards import (
    Progress,
    assemble,
    plan_shards,
    segment_shards,
    shard_figures,
    shard_file,
)
from tibnlp.text.words import SPLIT_AFFIXES, botok_version, cache_root, pack_digest, require_pack

FORMAT_VERSION = 1
META_FILE = "meta.json"
RUN_FILE = ".words-run.json"  # in words/: how and from where it was made (module docstring)
WORDS_DIR = "words"
PARTIAL_DIR = ".words.partial"
SPLITS = ("train", "heldout")
# meta.json's fields, in its order: what the words are, nothing of how they were made
META_FIELDS = (
    "key",
    "corpus",
    "pack_sha256",
    "botok",
    "split_affixes",
    "characters",
    "syllables",
    "words",
)


def stderr_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def corpus_key(corpus_dir: Path, corpus: Any) -> str:
    """Names the prepared corpus's content (its report and split fingerprints)."""
    report = Path(corpus_dir) / "report.json"
    key = {
        "report_sha256": hashlib.sha256(report.read_bytes()).hexdigest()
        if report.is_file()
        else None,
        "fingerprints": {s: getattr(corpus[s], "_fingerprint", None) for s in sorted(corpus)},
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def words_key(corpus_id: str, pack_sha: str) -> str:
    """Names a segmentation: the corpus, the pack's content and the botok version."""
    key = {
        "format": FORMAT_VERSION,
        "corpus": corpus_id,
        "pack": pack_sha,
        "botok": botok_version(),
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _read_meta(corpus_dir: Path) -> dict[str, Any] | None:
    path = Path(corpus_dir) / WORDS_DIR / META_FILE
    if not path.is_file():
        return None
    return dict(json.loads(path.read_text(encoding="utf-8")))


def segment_corpus(
    corpus_dir: Path,
    num_proc: int = 0,
    pack: Path | None = None,
    cache: Path | None = None,
    progress: Progress | None = stderr_progress,
) -> dict[str, Any]:
    """Find the botok words of a prepared corpus and store them in CORPUS/words/ (module
    docstring). Words already there for the same corpus, pack and botok are kept; an
    interrupted run resumes from its finished shards. Returns their meta with `kept` (True:
    they were up to date) and, when segmented now, this run's facts (RUN_FILE's: num_proc,
    shards, resumed_shards, wall_seconds, ...), which the caller reports."""
    from tibnlp.text.prepared import load_prepared

    corpus_dir = Path(corpus_dir)
    corpus = load_prepared(corpus_dir)
    pack = require_pack(pack)
    corpus_id, pack_sha = corpus_key(corpus_dir, corpus), pack_digest(pack)
    key = words_key(corpus_id, pack_sha)
    meta = _read_meta(corpus_dir)
    if meta is not None and meta.get("key") == key:
        meta = _migrate(corpus_dir, meta, progress or _quiet)
        if meta is not None:
            return {**meta, "kept": True}
    procs = num_proc or os.cpu_count() or 1
    identity = {"key": key, "corpus": corpus_id, "pack_sha256": pack_sha}
    run = _build(
        corpus_dir, corpus, procs, pack, cache or cache_root(), identity, progress or _quiet
    )
    meta = _read_meta(corpus_dir)
    assert meta is not None
    return {**meta, "kept": False, **run}


def finished_shards(corpus_dir: Path) -> int:
    """Shards an interrupted run left for the next to resume from (not one cut short while
    being written: `tibnlp.text.word_shards`' temporary)."""
    files = (Path(corpus_dir) / PARTIAL_DIR).glob("*.npz")
    return sum(not f.name.endswith(".tmp.npz") for f in files)


def load_words(corpus_dir: Path, corpus: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """({split: Dataset(word_starts)}, meta) stored with a prepared corpus, checked against it.

    Needs neither botok nor the pack: pretraining reads what preparation found."""
    from tibnlp.text.prepared import load_saved

    corpus_dir = Path(corpus_dir)
    meta = _read_meta(corpus_dir)
    where = corpus_dir / WORDS_DIR
    if meta is None:
        raise DataError(
            f"{corpus_dir} has no botok words ({where / META_FILE} is missing); whole-word "
            "masking (pretrain.masking=whole_word) needs them",
            f"run `tibnlp corpus words {corpus_dir}` once, or prepare the corpus with "
            "--set corpus.words=true (in a pipeline: corpus.words: true)",
        )
    if meta.get("corpus") != corpus_key(corpus_dir, corpus):
        raise DataError(
            f"{where}: the words were found for another version of this corpus",
            f"run `tibnlp corpus words {corpus_dir}` again",
        )
    hint = f"delete {where} and run `tibnlp corpus words {corpus_dir}` again"
    words = {s: load_saved(where / s, "botok words", hint) for s in SPLITS}
    for split, ds in words.items():
        if len(ds) != len(corpus[split]):
            raise DataError(
                f"{where}: {len(ds)} rows of words for {len(corpus[split])} documents of the "
                f"{split!r} split",
                f"run `tibnlp corpus words {corpus_dir}` again",
            )
    return words, meta


def _quiet(_: str) -> None:
    return None


def _meta_text(meta: dict[str, Any]) -> str:
    """meta.json's bytes: `META_FIELDS` alone, in their order (module docstring)."""
    return json.dumps({k: meta[k] for k in META_FIELDS}, indent=2) + "\n"


def _migrate(corpus_dir: Path, meta: dict[str, Any], progress: Progress) -> dict[str, Any] | None:
    """Current words' meta, in today's layout. Words found before the run file existed have
    the current key but run facts (seconds, num_proc, the pack's path) in meta.json: kept as
    they were, they made the corpus hash differently on every copy for good. Those facts move
    to the run file (each file replaced whole); None when meta.json lacks a field of today's
    (words to find again). A folder that cannot be written keeps its words as they are."""
    if list(meta) == list(META_FIELDS):
        return meta
    words = Path(corpus_dir) / WORDS_DIR
    lacking = [k for k in META_FIELDS if k not in meta]
    if lacking:
        progress(
            f"botok words: {words / META_FILE} lacks {', '.join(lacking)} (an older layout); "
            "finding the words again"
        )
        return None
    run = {k: v for k, v in meta.items() if k not in META_FIELDS}
    try:
        if run:  # (before meta.json: a stop between the two leaves an old meta, moved again)
            atomic_write_text(words / RUN_FILE, json.dumps(run, indent=2) + "\n")
        atomic_write_text(words / META_FILE, _meta_text(meta))
    except (OSError, DataError) as exc:  # (DataError: a folder it may not write)
        why = exc.message if isinstance(exc, DataError) else exc
        progress(
            f"botok words: could not move the run facts out of {words / META_FILE} ({why}); "
            "the words are kept as they are"
        )
        return meta
    progress(
        f"botok words: {words / META_FILE} held how it was made (seconds, num_proc, pack "
        f"path), from before {RUN_FILE}; moved there, so the corpus hashes by its words alone"
    )
    return {k: meta[k] for k in META_FIELDS}


def _build(
    corpus_dir: Path,
    corpus: Any,
    num_proc: int,
    pack: Path,
    cache: Path,
    identity: dict[str, str],
    progress: Progress,
) -> dict[str, Any]:
    """Segment what the partial folder lacks, publish words/; returns the run's facts.
    `identity`: the words' key and what it is made of (corpus key, pack digest), as
    `segment_corpus` computed them: meta.json's first fields."""
    from tibnlp.text.prepared import save_splits

    key = identity["key"]

    partial = corpus_dir / PARTIAL_DIR
    stamp = partial / "key.txt"
    if partial.exists() and (not stamp.is_file() or stamp.read_text().strip() != key):
        shutil.rmtree(partial)  # shards of another corpus, pack or botok: start over
    partial.mkdir(parents=True, exist_ok=True)
    stamp.write_text(key + "\n")
    for split in SPLITS:
        if split not in corpus:
            raise DataError(f"{corpus_dir}: the prepared corpus has no {split!r} split")
    shards = [s for split in SPLITS for s in plan_shards(split, corpus[split])]
    jobs = [
        (split, first, end, str(shard_file(partial, split, first)))
        for split, first, end, _ in shards
        if not shard_file(partial, split, first).is_file()
    ]
    total = sum(s[3] for s in shards)
    todo = sum(s[3] for s in shards if not shard_file(partial, s[0], s[1]).is_file())
    procs = max(1, min(num_proc, len(jobs)))
    progress(
        f"botok words: {len(shards)} shards, {total:,} characters; {len(jobs)} to segment "
        f"on {procs} process(es) (pack {pack})"
    )
    began = time.perf_counter()
    if jobs:
        segment_shards(corpus_dir, jobs, procs, pack, cache, todo, progress)
    figures = {"characters": 0, "syllables": 0, "words": 0}
    seconds = {"shard_seconds": 0.0, "cpu_seconds": 0.0}
    with staged_dir(corpus_dir / WORDS_DIR, replace=True) as tmp:
        for split in SPLITS:
            files = [shard_file(partial, split, first) for s, first, _, _ in shards if s == split]
            for f in files:
                fig = shard_figures(f)
                for k in figures:
                    figures[k] += int(fig[k])
                seconds["shard_seconds"] += float(fig["seconds"])
                seconds["cpu_seconds"] += float(fig["cpu_seconds"])
            save_splits(assemble(files), tmp / split)
        meta = {**identity, "botok": botok_version(), "split_affixes": SPLIT_AFFIXES, **figures}
        run = {  # how and from where this copy was made
            "pack": str(pack),
            "num_proc": procs,
            "wall_seconds": round(time.perf_counter() - began, 2),
            "shards": len(shards),
            "resumed_shards": len(shards) - len(jobs),
            **seconds,
        }
        (tmp / META_FILE).write_text(_meta_text(meta), encoding="utf-8")
        (tmp / RUN_FILE).write_text(json.dumps(run, indent=2) + "\n", encoding="utf-8")
    shutil.rmtree(partial, ignore_errors=True)
    progress(
        f"botok words: {figures['words']:,} words, {figures['syllables']:,} syllables in "
        f"{run['wall_seconds']:.0f} s -> {corpus_dir / WORDS_DIR}"
    )
    return run
