"""SOP pretraining examples on disk and length-bucketed batches."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from tibetan_fixtures import prepared_inputs

from tibnlp.data.masking import MlmCollator
from tibnlp.data.pretraining import (
    build_pretraining_dataset,
    length_bucketed_batches,
    load_pretraining_dataset,
)
from tibnlp.errors import DataError
from tibnlp.text.prepared import load_prepared
from tibnlp.text.vocab import Vocabulary

SEQ_LEN = 48


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Vocabulary, Path, Path]:
    root = prepared_inputs(tmp_path_factory.mktemp("pretrain"), n_docs=200, heldout=20)
    corpus = root / "corpus"
    vocab = Vocabulary.load(root / "vocab")
    out = build_pretraining_dataset(corpus, vocab, SEQ_LEN, root / "data", num_proc=1)
    return corpus, vocab, out, root


def test_columns_and_meta(setup: tuple) -> None:
    _, vocab, out, _ = setup
    ds, meta = load_pretraining_dataset(out)
    assert set(ds) == {"train", "heldout"}
    feats = ds["train"].features
    assert feats["input_ids"].feature.dtype == "int32"
    assert feats["token_type_ids"].feature.dtype == "int8"
    assert feats["syllable_start"].feature.dtype == "bool"
    assert feats["sop_label"].dtype == "int8" and feats["length"].dtype == "int32"
    assert meta["seq_len"] == SEQ_LEN and meta["vocab_sha256"] == vocab.sha256
    assert meta["counts"] == {"train": len(ds["train"]), "heldout": len(ds["heldout"])}
    assert meta["median_length"] == statistics.median(ds["train"]["length"])
    assert meta["corpus_report_sha256"]


def test_examples_are_well_formed(setup: tuple) -> None:
    _, vocab, out, _ = setup
    ds, _ = load_pretraining_dataset(out)
    for ex in ds["train"]:
        ids, types = ex["input_ids"], ex["token_type_ids"]
        assert ex["length"] == len(ids) <= SEQ_LEN
        assert ids[0] == vocab.cls_id and ids[-1] == vocab.sep_id
        first_sep = ids.index(vocab.sep_id)
        assert 1 < first_sep < len(ids) - 2  # A and B both non-empty
        assert types == [0] * (first_sep + 1) + [1] * (len(ids) - first_sep - 1)
        # cuts fall on syllable starts, so the stored flags are those of the joined pieces
        assert ex["syllable_start"] == vocab.syllable_starts(ids)


def _contains(stream: list[int], part: list[int], start: int) -> int:
    """Index after `part` found contiguously in `stream` at or after `start`, else -1."""
    for i in range(start, len(stream) - len(part) + 1):
        if stream[i : i + len(part)] == part:
            return i + len(part)
    return -1


def test_pairs_come_from_one_document_in_order(setup: tuple) -> None:
    """Un-swapped, A + B is a contiguous run of its document's tokens, the runs in order; only
    a lone one-syllable chunk (a document tail that cannot be cut into A and B) is dropped."""
    corpus, vocab, out, _ = setup
    ds, _ = load_pretraining_dataset(out)
    docs = {r["doc_id"]: r["sentences"] for r in load_prepared(corpus)["train"]}
    streams = {d: [t for ids in vocab.encode_batch(s) for t in ids] for d, s in docs.items()}
    position: dict[int, int] = {}
    used = 0
    for ex in ds["train"]:
        ids = ex["input_ids"]
        sep = ids.index(vocab.sep_id)
        first, second = ids[1:sep], ids[sep + 1 : -1]
        a, b = (second, first) if ex["sop_label"] else (first, second)
        doc = ex["doc_id"]
        end = _contains(streams[doc], a + b, position.get(doc, 0))
        assert end >= 0, f"document {doc}: A+B is not a contiguous run after the previous pair"
        position[doc] = end
        used += len(a) + len(b)
    assert len(position) > 100
    assert used / sum(len(s) for s in streams.values()) > 0.99


def test_half_of_the_pairs_are_swapped(setup: tuple) -> None:
    _, _, out, _ = setup
    ds, meta = load_pretraining_dataset(out)
    labels = ds["train"]["sop_label"]
    assert len(labels) > 400
    assert sum(labels) / len(labels) == pytest.approx(0.5, abs=0.07)  # > 3 standard errors
    assert meta["sop_swapped"]["train"] == sum(labels)


def test_cached_and_guarded(setup: tuple) -> None:
    corpus, vocab, out, root = setup
    stamp = (out / "meta.json").stat().st_mtime_ns
    assert build_pretraining_dataset(corpus, vocab, SEQ_LEN, out, num_proc=1) == out
    assert (out / "meta.json").stat().st_mtime_ns == stamp
    with pytest.raises(DataError, match="other inputs"):
        build_pretraining_dataset(corpus, vocab, SEQ_LEN, out, seed=1)
    with pytest.raises(DataError, match="not a pretraining dataset"):
        load_pretraining_dataset(root / "vocab")
    with pytest.raises(DataError, match="not a prepared corpus"):
        build_pretraining_dataset(root / "vocab", vocab, SEQ_LEN, root / "x")
    assert not [p for p in root.iterdir() if p.name.startswith(".")]


def test_parallel_build_is_identical(setup: tuple) -> None:
    corpus, vocab, out, root = setup
    two = build_pretraining_dataset(corpus, vocab, SEQ_LEN, root / "data2", num_proc=2)
    a, b = load_pretraining_dataset(out)[0], load_pretraining_dataset(two)[0]
    assert a["train"].to_dict() == b["train"].to_dict()
    assert a["train"]._fingerprint == b["train"]._fingerprint  # (of the inputs alone)
    # the workers' files were staged with the output, never written beside the corpus
    assert not list(corpus.rglob("cache-*"))
    assert json.loads((two / "meta.json").read_text())["median_length"] == statistics.median(
        a["train"]["length"]
    )


def test_collator_on_real_examples(setup: tuple) -> None:
    _, vocab, out, _ = setup
    ds, _ = load_pretraining_dataset(out)
    examples = [ds["train"][i] for i in range(16)]
    batch = MlmCollator(vocab, seed=1)(examples, 0)
    assert batch["input_ids"].shape[0] == 16
    assert int((batch["mlm_labels"] != -100).sum()) > 0


def test_bucketing_covers_every_index_once() -> None:
    import random

    rng = random.Random(0)
    lengths = [rng.randint(5, 512) for _ in range(5003)]
    batches = length_bucketed_batches(lengths, 32, seed=1, epoch=0)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(len(lengths)))
    assert all(len(b) == 32 for b in batches if len(b) != 5003 % 32) and len(batches) == 157
    assert batches == length_bucketed_batches(lengths, 32, seed=1, epoch=0)
    assert batches != length_bucketed_batches(lengths, 32, seed=1, epoch=1)

    # padding: bucketed batches waste far less than random ones
    def waste(bs: list[list[int]]) -> float:
        return sum(max(lengths[i] for i in b) * len(b) - sum(lengths[i] for i in b) for b in bs)

    order = list(range(len(lengths)))
    rng.shuffle(order)
    random_batches = [order[i : i + 32] for i in range(0, len(order), 32)]
    assert waste(batches) < 0.1 * waste(random_batches)
