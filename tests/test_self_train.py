"""benchmarks/self_train.py: corpus sentences labelled by an ensemble of fine-tuned seeds join
the training titles, in the training titles' class shares, most confident first."""

from __future__ import annotations

import json
import lzma
import random
import runpy
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tests.ft_fixtures import LABELS, make_data_dir, make_title, make_vocab, tiny_textcnn
from tibnlp.config import load_config
from tibnlp.training.finetune import run_finetune

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "self_train.py"
sys.path.insert(0, str(SCRIPT.parent))
import self_train  # noqa: E402


def test_title_form_keeps_syllables_only() -> None:
    assert self_train.title_form("བོད་ཀྱི་ abc སློབ་གྲྭ་༢༠༡༢་ལོ། ") == "བོད ཀྱི སློབ གྲྭ ༢༠༡༢ ལོ"


def test_pool_cuts_at_shad_filters_length_and_drops_known_titles(tmp_path: Path) -> None:
    corpus = tmp_path / "c.txt.xz"
    with lzma.open(corpus, "wt", encoding="utf-8") as fh:
        fh.write("ཀ་ཁ་ག། ཀ་ཁ་ག་ང། ཅ་ཆ་ཇ་ཉ་ཏ།\nཀ་ཁ་ག་ང།། ཐ་ད་ན་པ༎\n")
    pool = self_train.pool_sentences([corpus], 4, 4, exclude={"ཅ ཆ ཇ ཉ"})
    # 3 syllables and 5 are out of range; the repeat and the excluded title are dropped
    assert pool == [("c", "ཀ ཁ ག ང"), ("c", "ཐ ད ན པ")]


def test_select_takes_each_class_share_most_confident_first() -> None:
    probs = np.array([[0.9, 0.1], [0.6, 0.4], [0.8, 0.2], [0.3, 0.7], [0.45, 0.55], [0.2, 0.8]])
    # size 4, shares 1/2 each: class 0 takes rows 0 and 2, class 1 rows 5 and 3
    assert self_train.select(probs, np.array([0.5, 0.5]), 4) == [0, 2, 3, 5]
    # a class with fewer assigned rows than its quota gives what it has
    assert self_train.select(probs, np.array([0.1, 0.9]), 10) == [0, 3, 4, 5]


def test_script_writes_a_data_dir_the_finetuning_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_data_dir(tmp_path / "data")
    (root / "corpora").mkdir()
    rng = random.Random(7)
    lines = [
        "།".join(make_title(i % 3, rng).replace(" ", "་") for i in range(6)) for _ in range(40)
    ]
    with lzma.open(root / "corpora" / "news.txt.xz", "wt", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    monkeypatch.setenv("TIBNLP_DATA", str(root))
    vocab = make_vocab(tmp_path / "vocab")
    teachers = [
        run_finetune(
            load_config(None, tiny_textcnn(vocab, tmp_path / f"t{s}", f"finetune.seeds=[{s}]")),
            "tncc",
        )
        .seeds[0]
        .directory
        for s in (1, 2)
    ]
    out = tmp_path / "st"
    argv = [
        str(SCRIPT),
        "--teachers",
        *map(str, teachers),
        "--out",
        str(out),
        "--corpora",
        "news",
        "--size",
        "30",
        "--min-len",
        "3",
        "--max-len",
        "8",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_path(str(SCRIPT), run_name="__main__")
    train = [
        json.loads(x) for x in (out / "tncc" / self_train.TRAIN).read_text("utf-8").splitlines()
    ]
    gold, added = train[:90], train[90:]
    assert [r["id"] for r in gold] == [f"train-{i}" for i in range(90)]
    assert len(added) == 30 and Counter(r["label"] for r in added) == {n: 10 for n in LABELS}
    titles = {
        r["text"]
        for name in self_train.SPLITS
        for r in map(json.loads, (root / "tncc" / name).read_text("utf-8").splitlines())
    }
    assert not titles & {r["text"] for r in added}
    for r in added:
        assert LABELS[r["label_id"]] == r["label"] and 1 / 3 < r["confidence"] <= 1
    assert (out / "tncc" / "tncc_title_test.jsonl").resolve() == (
        root / "tncc" / "tncc_title_test.jsonl"
    ).resolve()
    # the student: the same fine-tuning reads the new data directory
    monkeypatch.setenv("TIBNLP_DATA", str(out))
    result = run_finetune(load_config(None, tiny_textcnn(vocab, tmp_path / "student")), "tncc")
    assert result.seeds[0].directory.is_dir()
    with pytest.raises(SystemExit, match="exists"):
        runpy.run_path(str(SCRIPT), run_name="__main__")
