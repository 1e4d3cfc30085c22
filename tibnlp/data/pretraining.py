"""Pretraining examples: tokenised ALBERT sentence-order pairs, on disk, plus length bucketing.

Example filling (ALBERT's `create_instances_from_document`, with SOP): the sentences of ONE
document are accumulated until they reach a target of `seq_len - 3` tokens (with probability
`short_seq_prob` a random shorter target in [2, seq_len - 3], so the model also sees short
inputs), then cut at a random sentence boundary into A and B; with probability 1/2 they are
swapped (`sop_label` 1). A chunk of one sentence is cut at a syllable boundary near its middle.
Sentences longer than the budget are first split at syllable boundaries, so no text is lost to
truncation. Without a pair task (`pairs=False`: MLM only, no SOP, no same-document contrast) a
chunk of one sentence is not cut: it becomes `[CLS] text [SEP]`, all segment 0, the layout
fine-tuning reads a text in (a title of the title stage is one such chunk); chunks of several
sentences keep their A/B pair.

Consequence for `median_length` (the DMA-ALBERT threshold `m`): most examples are
full (close to `seq_len`); short ones come from the `short_seq_prob` draws and from document
tails, so the median sits near `seq_len` on long-document corpora and drops on corpora of
short documents. Measured on the real corpus (16000-piece vocabulary, short_seq_prob 0.1):
seq_len 512 -> median 468, mean 407; seq_len 128 -> median 116, mean 102. A median this close
to `seq_len` makes DMA's batch rule pick `h_l` for about half the batches; lower
`short_seq_prob` raises it, packing several documents per example would remove the tails.

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
from tibnlp.data.words import LEVELS_VERSION, WORD, boundary_columns, piece_levels
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


def _load_corpus(path: Path) -> Any:
    from tibnlp.text.vocab_build import load_corpus

    return load_corpus(path)


def _split_long(ids: list[int], starts: list, limit: int, head: int) -> list[tuple[list, list]]:
    """Cut a token sequence into parts of <= limit tokens at the strongest boundary within
    the limit (a word start, else a syllable start: `tibnlp.data.words` levels), the latest."""
    parts = []
    while len(ids) > limit:
        top = max(starts[1 : limit + 1])
        cut = max((i for i in range(1, limit + 1) if top and starts[i] == top), default=limit)
        parts.append((ids[:cut], starts[:cut]))
        ids, starts = ids[cut:], [head, *starts[cut + 1 :]]
    parts.append((ids, starts))
    return parts


def _pair(
    chunk: list[tuple[list, list]], rng: random.Random
) -> tuple[list[int], list[int], list[int], list[int]] | None:
    if len(chunk) >= 2:
        a_end = rng.randint(1, len(chunk) - 1)
        a = [t for s in chunk[:a_end] for t in s[0]], [t for s in chunk[:a_end] for t in s[1]]
        b = [t for s in chunk[a_end:] for t in s[0]], [t for s in chunk[a_end:] for t in s[1]]
        return a[0], a[1], b[0], b[1]
    ids, starts = chunk[0]
    top = max(starts[1:], default=0)
    cuts = [i for i in range(1, len(ids)) if top and starts[i] == top]
    if not cuts:
        return None
    cut = min(cuts, key=lambda i: abs(i - len(ids) / 2))
    return ids[:cut], starts[:cut], ids[cut:], starts[cut:]


def make_examples(
    doc_id: int,
    sentences: list[list[int]],
    vocab: Vocabulary,
    seq_len: int,
    rng: random.Random,
    short_seq_prob: float,
    sop_prob: float = 0.5,
    levels: list[list[int]] | None = None,
    pairs: bool = True,
) -> list[dict[str, Any]]:
    """SOP examples of one document (see the module docstring for the policy); `sop_prob`:
    the share of pairs whose segments are swapped (0: text in order, for MLM without SOP);
    `pairs=False`: no task reads the pair, so a one-sentence chunk stays one segment.

    `levels` (per sentence, per piece: `tibnlp.data.words.piece_levels`) adds the column
    `word_start`, and cuts prefer word boundaries; without it boundaries are syllables."""
    budget = seq_len - 3
    head = WORD if levels is not None else True
    parts = []
    for n, ids in enumerate(sentences):
        if ids:
            starts = levels[n] if levels is not None else vocab.syllable_starts(ids)
            parts.extend(_split_long(ids, starts, budget, head))
    out: list[dict[str, Any]] = []
    target = rng.randint(2, budget) if rng.random() < short_seq_prob else budget
    chunk: list[tuple[list, list]] = []
    size = 0
    for i, part in enumerate(parts):
        if chunk and size + len(part[0]) > budget:  # would overflow: emit what we have
            out.extend(_emit(doc_id, chunk, vocab, rng, sop_prob, head, pairs))
            chunk, size = [], 0
            target = rng.randint(2, budget) if rng.random() < short_seq_prob else budget
        chunk.append(part)
        size += len(part[0])
        if size >= target or i == len(parts) - 1:
            out.extend(_emit(doc_id, chunk, vocab, rng, sop_prob, head, pairs))
            chunk, size = [], 0
            target = rng.randint(2, budget) if rng.random() < short_seq_prob else budget
    return out


def _emit(
    doc_id: int,
    chunk: list[tuple[list, list]],
    vocab: Vocabulary,
    rng: random.Random,
    sop_prob: float,
    head: int = True,
    pairs: bool = True,
) -> list[dict[str, Any]]:
    pair = _pair(chunk, rng)
    if pair is None:
        return []
    a, a_starts, b, b_starts = pair
    # A and B each open a unit: a chunk of one word cut in two makes two words (masked apart)
    a_starts, b_starts = [head, *a_starts[1:]], [head, *b_starts[1:]]
    swapped = rng.random() < sop_prob  # drawn either way: the document's later draws stay
    if not pairs and len(chunk) == 1:  # nothing reads the cut: the sentence stays whole
        ids, starts = chunk[0]
        whole = [vocab.cls_id, *ids, vocab.sep_id]
        return [
            {
                "input_ids": whole,
                "token_type_ids": [0] * len(whole),
                **boundary_columns([head, head, *starts[1:], head], head == WORD),
                "sop_label": 0,
                "length": len(whole),
                "doc_id": doc_id,
            }
        ]
    if swapped:
        a, a_starts, b, b_starts = b, b_starts, a, a_starts
    ids = [vocab.cls_id, *a, vocab.sep_id, *b, vocab.sep_id]
    return [
        {
            "input_ids": ids,
            "token_type_ids": [0] * (len(a) + 2) + [1] * (len(b) + 1),
            **boundary_columns([head, *a_starts, head, *b_starts, head], head == WORD),
            "sop_label": int(swapped),
            "length": len(ids),
            "doc_id": doc_id,
        }
    ]


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

    from tibnlp.text.prepared import save_splits

    corpus_dir, out_dir = Path(corpus_dir), Path(out_dir)
    if seq_len < 8:
        raise DataError(f"seq_len {seq_len} is too short for [CLS] A [SEP] B [SEP]; use >= 8")
    if not 0.0 <= short_seq_prob <= 1.0:
        raise DataError(f"short_seq_prob {short_seq_prob} must be in [0, 1]")
    if masking not in MASKING:
        raise DataError(f"masking {masking!r} is not one of {', '.join(MASKING)}")
    corpus = _load_corpus(corpus_dir)
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
    if len(_load_corpus(Path(corpus_dir))[split]):
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
