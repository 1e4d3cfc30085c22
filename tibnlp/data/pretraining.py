"""Pretraining examples on disk: a prepared corpus tokenised into ALBERT sentence-order pairs
(filled as `sop_examples` says) or segment chains, cached by its inputs, plus length bucketing.

Examples are stored unpadded (`length` real tokens); the collator pads per batch.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tibnlp.data.segment_chains import chain_lengths, make_chains
from tibnlp.data.sop_examples import make_examples
from tibnlp.data.words import LEVELS_VERSION, piece_levels
from tibnlp.errors import DataError
from tibnlp.fsutil import staged_dir
from tibnlp.text.vocab import Vocabulary

FORMAT_VERSION = 1
META_FILE = "meta.json"
MASKING = ("span", "whole_word")  # pretrain.masking; whole_word adds the column word_start
SPLITS = ("train", "heldout")  # the splits a full build tokenises


class OtherInputsError(DataError):
    """The output folder holds pretraining data built from other inputs (a `--resume` says
    it in terms of the run)."""


def _features(words: bool = False) -> Any:
    import datasets

    columns = {
        "input_ids": datasets.Sequence(datasets.Value("int32")),
        "token_type_ids": datasets.Sequence(datasets.Value("int8")),
        "syllable_start": datasets.Sequence(datasets.Value("bool")),
        "sop_label": datasets.Value("int8"),
        "length": datasets.Value("int32"),
        "doc_id": datasets.Value("int64"),
    }
    if words:  # only then: span-masking datasets keep their columns and cache keys
        columns["word_start"] = datasets.Sequence(datasets.Value("bool"))
    return datasets.Features(columns)


def _examples_batch(
    batch: dict[str, list],
    vocab: Vocabulary,
    seq_len: int,
    seed: int,
    split: str,
    short: float,
    segments: int = 0,
    sop_prob: float = 0.5,
    pairs: bool = True,
) -> dict[str, list]:
    words = "word_starts" in batch  # the corpus came joined with its botok words
    out: dict[str, list] = {k: [] for k in _features(words)}
    for n, (doc_id, sentences) in enumerate(zip(batch["doc_id"], batch["sentences"], strict=True)):
        rng = random.Random(f"{seed}/{split}/{doc_id}")  # per document: order-independent
        levels = None
        if words:
            aligned = [
                piece_levels(vocab, s, w)
                for s, w in zip(sentences, batch["word_starts"][n], strict=True)
            ]
            ids, levels = [a[0] for a in aligned], [a[1] for a in aligned]
        else:
            ids = vocab.encode_batch(sentences, num_threads=1) if sentences else []
        examples = (
            make_chains(int(doc_id), ids, vocab, seq_len, segments, levels)
            if segments
            else make_examples(
                int(doc_id), ids, vocab, seq_len, rng, short, sop_prob, levels, pairs
            )
        )
        for ex in examples:
            for key, value in ex.items():
                out[key].append(value)
    return out


def _sha256_file(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def _tokenise(
    ds: Any,
    words: Any,
    fn_kwargs: dict[str, Any],
    procs: int,
    work: Path,
    fingerprint: str,
) -> Any:
    """One split's examples (`_examples_batch`), written under `work`: over `procs` forked
    processes (`tibnlp.text.process_map`: stopped, `datasets`' own pool printed pages of
    worker tracebacks, or hung), or in this process when one is enough. Same rows either
    way; `fingerprint` (of the cache key) is the result's, whatever the process count."""
    import datasets

    from tibnlp.text.process_map import map_batches

    features = _features(words is not None)
    if len(ds) == 0:  # (heldout_fraction 0) `map` of no rows would write no schema
        return datasets.Dataset.from_dict({k: [] for k in features}, features=features)
    if words is not None:
        ds = datasets.concatenate_datasets([ds, words], axis=1)
    return map_batches(
        ds,
        _examples_batch,
        fn_kwargs,
        procs,
        work,
        f"tokenising {fn_kwargs['split']}",
        datasets.is_progress_bar_enabled(),
        batch_size=16,
        writer_batch_size=1000,  # (`datasets`' default, as before: the same files)
        remove_columns=ds.column_names,
        features=features,
        fingerprint=fingerprint,
    )


def build_pretraining_dataset(
    corpus_dir: Path,
    vocab: Vocabulary,
    seq_len: int,
    out_dir: Path,
    seed: int = 42,
    num_proc: int = 0,
    short_seq_prob: float = 0.1,
    segments: int = 0,
    sop_prob: float = 0.5,
    masking: str = "span",
    splits: Sequence[str] = SPLITS,
    pairs: bool = True,
) -> Path:
    """Tokenise a prepared corpus into SOP examples under `out_dir` (cached by its inputs).

    `segments > 0`: chains of that many consecutive `seq_len` segments of one document instead
    (segment-recurrence pretraining, `tibnlp.data.segment_chains`); `median_length` is then
    the median segment length, the length the encoder (and DMA's threshold) sees.
    `sop_prob`: share of swapped pairs (`pretrain.sop_prob`; 0 when `pretrain.sop` is off).
    `masking="whole_word"`: examples also carry `word_start`, from the botok words stored with
    the corpus (`tibnlp corpus words`, read by `tibnlp.text.corpus_words.load_words`), and
    cuts prefer word boundaries.
    `pairs=False`: no pair task reads the examples (MLM only: `pretrain.sop` off and no
    `pretrain.contrastive`), so a one-sentence chunk is one segment, `[CLS] text [SEP]`.
    `splits`: the corpus splits to tokenise (`("heldout",)` for `pretrain --eval-only`, which
    scores that split alone); `median_length` then comes from the first of them.
    """
    import datasets

    from tibnlp.text.prepared import load_prepared, save_splits

    corpus_dir, out_dir = Path(corpus_dir), Path(out_dir)
    if seq_len < 8:
        raise DataError(f"seq_len {seq_len} is too short for [CLS] A [SEP] B [SEP]; use >= 8")
    if not 0.0 <= short_seq_prob <= 1.0:
        raise DataError(f"short_seq_prob {short_seq_prob} must be in [0, 1]")
    if masking not in MASKING:
        raise DataError(f"masking {masking!r} is not one of {', '.join(MASKING)}")
    corpus = load_prepared(corpus_dir)
    key = {
        "format": FORMAT_VERSION,
        "seq_len": seq_len,
        "vocab_sha256": vocab.sha256,
        "corpus_report_sha256": _sha256_file(corpus_dir / "report.json"),
        "corpus_fingerprints": {
            s: getattr(corpus[s], "_fingerprint", None) for s in sorted(corpus)
        },
        "seed": seed,
        "short_seq_prob": short_seq_prob,
    }
    if tuple(splits) != SPLITS:  # a partial build only: full builds keep their cache keys
        key["splits"] = list(splits)
    if segments:  # added only when set: the cache keys of SOP datasets stay as they were
        key["segments"] = segments
    if sop_prob != 0.5:  # likewise
        key["sop_prob"] = sop_prob
    if not pairs:  # likewise; data built before one-sentence chunks stayed whole is rebuilt
        key["pairs"] = False
    words = None
    if masking == "whole_word":  # likewise; the words key names the segmentation (pack, botok)
        from tibnlp.text.corpus_words import load_words

        words, words_meta = load_words(corpus_dir, corpus)
        key["masking"] = masking
        key["words"] = words_meta["key"]
        key["word_levels"] = LEVELS_VERSION  # data built with older alignments is rebuilt
    cache_key = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    if (out_dir / META_FILE).is_file():
        meta = json.loads((out_dir / META_FILE).read_text(encoding="utf-8"))
        if meta.get("cache_key") == cache_key:
            return out_dir
        raise OtherInputsError(
            f"{out_dir} holds pretraining data built from other inputs",
            "choose another output folder or delete it",
        )
    if out_dir.exists() and any(out_dir.iterdir()):
        raise DataError(f"{out_dir} exists and is not a pretraining dataset; choose another")
    procs = num_proc or os.cpu_count() or 1
    for split in splits:
        if split not in corpus:
            raise DataError(f"{corpus_dir}: the prepared corpus has no {split!r} split")
    settings = {
        "vocab": vocab,
        "seq_len": seq_len,
        "seed": seed,
        "short": short_seq_prob,
        "segments": segments,
        "sop_prob": sop_prob,
        "pairs": pairs,
    }
    with staged_dir(out_dir) as tmp:  # a stop or an error leaves no folder behind
        work = tmp / "work"
        built = {}
        for split in splits:
            part = work / split
            part.mkdir(parents=True)
            fingerprint = hashlib.sha256(f"{cache_key}/{split}".encode()).hexdigest()[:16]
            built[split] = _tokenise(
                corpus[split],
                None if words is None else words[split],
                {**settings, "split": split},
                procs,
                part,
                fingerprint,
            )
        first = splits[0]  # the train split, unless it was not asked for
        if len(built[first]) == 0:
            raise DataError(
                f"{corpus_dir}: no pretraining example could be made from the {first} split"
            )
        lengths = list(built[first]["length"])
        if segments:
            lengths = [n for length in lengths for n in chain_lengths(length, seq_len)]
        meta = {
            **key,
            "cache_key": cache_key,
            "vocab_size": vocab.size,
            "corpus": str(corpus_dir.resolve()),
            "counts": {s: len(d) for s, d in built.items()},
            "tokens": {s: int(np.sum(d["length"])) if len(d) else 0 for s, d in built.items()},
            "sop_swapped": {
                s: int(np.sum(d["sop_label"])) if len(d) else 0 for s, d in built.items()
            },
            "median_length": float(statistics.median(lengths)),
            "mean_length": float(np.mean(lengths)),
        }
        save_splits(datasets.DatasetDict(built), tmp / "dataset")
        del built  # (its files are the work files, removed next)
        shutil.rmtree(work)
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return out_dir


def load_pretraining_dataset(path: Path) -> tuple[Any, dict[str, Any]]:
    """(DatasetDict with train/heldout, meta) of a folder made by `build_pretraining_dataset`."""
    from tibnlp.text.prepared import load_saved

    path = Path(path)
    if not (path / META_FILE).is_file() or not (path / "dataset").is_dir():
        raise DataError(
            f"{path} is not a pretraining dataset (no {META_FILE} or dataset/)",
            "build it with build_pretraining_dataset (run by `tibnlp pretrain`)",
        )
    hint = f"delete {path}: it is a cache, the next `tibnlp pretrain` builds it again"
    try:
        meta = json.loads((path / META_FILE).read_text(encoding="utf-8"))
    except ValueError as exc:  # a cut-short meta file
        raise DataError(f"{path / META_FILE} cannot be read ({exc})", hint) from exc
    return load_saved(path / "dataset", "pretraining dataset", hint), meta


def require_documents(corpus_dir: Path, split: str) -> None:
    """Refuse a corpus whose `split` (the one a run reads: train, or heldout for
    `--eval-only`) is empty, before the run writes anything or tokenises for minutes."""
    from tibnlp.text.prepared import load_prepared

    if len(load_prepared(Path(corpus_dir))[split]):
        return
    if split == "train":
        raise DataError(
            f"{corpus_dir}: the prepared corpus has no training documents (its train split "
            "is empty)",
            "prepare it again from more documents or with a smaller corpus.heldout_fraction",
        )
    raise DataError(
        f"{corpus_dir}: the prepared corpus has no held-out documents to score",
        "prepare it again with corpus.heldout_fraction > 0 and at least two documents "
        "(a .txt document ends at a blank line)",
    )


def length_bucketed_batches(
    lengths: Sequence[int], batch_size: int, seed: int, epoch: int, chunk_batches: int = 50
) -> list[list[int]]:
    """Shuffled batches of similar lengths: shuffle, sort inside mega-chunks of
    `chunk_batches` batches, cut, shuffle the batch order. Deterministic in (seed, epoch);
    every index appears exactly once (the last batch may be smaller)."""
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    rng = np.random.default_rng([seed, epoch])
    lengths_a = np.asarray(lengths)
    order = rng.permutation(len(lengths_a))
    mega = batch_size * chunk_batches
    batches: list[list[int]] = []
    for start in range(0, len(order), mega):
        part = order[start : start + mega]
        part = part[np.argsort(lengths_a[part], kind="stable")]
        batches.extend(part[i : i + batch_size].tolist() for i in range(0, len(part), batch_size))
    perm = rng.permutation(len(batches))
    return [batches[i] for i in perm]
