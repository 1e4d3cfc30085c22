"""MLM-only pretraining data (no SOP, no same-document contrast): a one-sentence chunk is read
as fine-tuning reads a text, `[CLS] pieces [SEP]` in segment 0, not cut in two.

The title stage of the main job (`pipelines/quickstart.yaml`, `adapt`) is MLM on the TNCC
training titles, one title per document: every example used to be a title cut at a syllable
near its middle into `[CLS] A [SEP] B [SEP]`, B in segment 1, a layout fine-tuning never shows
the encoder (benchmarks/results/objective_levers.md: "one title per example, no second
segment")."""

from __future__ import annotations

import random
from pathlib import Path

import datasets
import pytest
from tibetan_fixtures import prepared_inputs, save_prepared, syllable

from tibnlp.config import load_config
from tibnlp.data.collate import encode_texts
from tibnlp.data.pretraining import build_pretraining_dataset, load_pretraining_dataset
from tibnlp.text.vocab import Vocabulary

SEQ_LEN = 48


def _titles(path: Path, n_docs: int = 120, heldout: int = 10) -> Path:
    """A prepared corpus of one sentence per document, as `corpus prepare` makes of titles:
    2 to 12 syllables joined by tsheg, no closing shad."""
    rng = random.Random(3)
    docs = [
        {
            "doc_id": i,
            "source": "titles",
            "sentences": ["་".join(syllable(rng) for _ in range(rng.randint(2, 12)))],
        }
        for i in range(n_docs)
    ]
    return save_prepared(path, docs, heldout, {"documents": n_docs})


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Vocabulary]:
    root = prepared_inputs(tmp_path_factory.mktemp("mlm-only"), n_docs=120, heldout=10)
    return root, Vocabulary.load(root / "vocab")


def test_a_title_is_one_segment_as_fine_tuning_reads_it(inputs: tuple, tmp_path: Path) -> None:
    _, vocab = inputs
    corpus = _titles(tmp_path / "titles")
    out = build_pretraining_dataset(
        corpus, vocab, SEQ_LEN, tmp_path / "data", num_proc=1, sop_prob=0.0, pairs=False
    )
    ds, meta = load_pretraining_dataset(out)
    texts = {
        r["doc_id"]: r["sentences"][0]
        for split in ("train", "heldout")
        for r in datasets.load_from_disk(str(corpus / "dataset"))[split]
    }
    for split in ("train", "heldout"):
        assert len(ds[split]) == meta["counts"][split] > 0
        for ex in ds[split]:
            ids = ex["input_ids"]
            assert ids == encode_texts(vocab, [texts[ex["doc_id"]]], SEQ_LEN)[0]
            assert ids.count(vocab.sep_id) == 1 and ids[-1] == vocab.sep_id
            assert ex["token_type_ids"] == [0] * len(ids)
            assert ex["syllable_start"] == vocab.syllable_starts(ids)
            assert ex["sop_label"] == 0


def test_only_one_part_chunks_change(inputs: tuple, tmp_path: Path) -> None:
    """On running text the examples are those of the pair layout, in the same order with the
    same tokens; the only difference is the [SEP] a one-sentence chunk was cut with."""
    root, vocab = inputs
    kw = {"num_proc": 1, "sop_prob": 0.0}
    pairs = load_pretraining_dataset(
        build_pretraining_dataset(root / "corpus", vocab, SEQ_LEN, tmp_path / "p", **kw)
    )[0]["train"]
    single = load_pretraining_dataset(
        build_pretraining_dataset(
            root / "corpus", vocab, SEQ_LEN, tmp_path / "s", pairs=False, **kw
        )
    )[0]["train"]
    assert len(single) == len(pairs)
    whole = 0
    for a, b in zip(pairs, single, strict=True):
        assert a["doc_id"] == b["doc_id"]
        content = [t for t in a["input_ids"] if t != vocab.sep_id]
        assert [t for t in b["input_ids"] if t != vocab.sep_id] == content
        if b["input_ids"].count(vocab.sep_id) == 1:
            whole += 1
            assert b["token_type_ids"] == [0] * len(b["input_ids"])
            assert b["syllable_start"] == vocab.syllable_starts(b["input_ids"])
        else:
            assert b == a
    assert 0 < whole < len(single)


def test_the_cache_key_tells_the_layouts_apart(inputs: tuple, tmp_path: Path) -> None:
    from tibnlp.errors import DataError

    root, vocab = inputs
    out = build_pretraining_dataset(
        root / "corpus", vocab, SEQ_LEN, tmp_path / "d", num_proc=1, sop_prob=0.0
    )
    with pytest.raises(DataError, match="other inputs"):
        build_pretraining_dataset(
            root / "corpus", vocab, SEQ_LEN, out, num_proc=1, sop_prob=0.0, pairs=False
        )


class _Built(Exception):
    pass


@pytest.mark.parametrize(
    ("sets", "pairs"),
    [
        (["pretrain.sop=false"], False),  # the main job's MLM stages
        (["pretrain.sop=true"], True),
        (["pretrain.sop=false", "pretrain.contrastive=0.1"], True),
    ],
)
def test_pretraining_asks_for_pairs_only_when_a_pair_task_reads_them(
    inputs: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sets: list, pairs: bool
) -> None:
    from tibnlp.training import pretrain
    from tibnlp.training.engine import World

    root, _ = inputs
    seen: dict = {}

    def build(*args: object, **kwargs: object) -> None:
        seen.update(kwargs)
        raise _Built

    monkeypatch.setattr(pretrain, "init_distributed", lambda _cfg: World(0, 0, 1))
    monkeypatch.setattr(pretrain, "build_pretraining_dataset", build)
    base = [
        f"pretrain.corpus={root / 'corpus'}",
        f"pretrain.vocab={root / 'vocab'}",
        f"pretrain.output={tmp_path / 'out'}",
        "tracking.enabled=false",
    ]
    with pytest.raises(_Built):
        pretrain.run_pretraining(load_config(None, [*base, *sets]))
    assert seen["pairs"] is pairs


def test_a_whole_sentence_keeps_its_word_levels(inputs: tuple) -> None:
    """Whole-word data: the uncut sentence carries its own word starts, [CLS]/[SEP] open units."""
    from tibnlp.data.sop_examples import make_examples
    from tibnlp.data.words import INSIDE, SYLLABLE, WORD

    _, vocab = inputs
    ids = vocab.encode("་".join(["ཀ", "ཁ", "ག", "ང", "ཅ"]))
    levels = [WORD] + [SYLLABLE if i % 2 else WORD for i in range(1, len(ids))]
    levels[-1] = INSIDE if len(ids) > 2 else levels[-1]
    (ex,) = make_examples(
        7, [ids], vocab, SEQ_LEN, random.Random(0), 0.0, 0.0, [levels], pairs=False
    )
    assert ex["input_ids"] == [vocab.cls_id, *ids, vocab.sep_id]
    assert ex["word_start"] == [True, *[x == WORD for x in levels], True]
    assert ex["syllable_start"] == [True, *[bool(x) for x in levels], True]
    assert ex["token_type_ids"] == [0] * (len(ids) + 2)
