"""benchmarks/corpus_coverage.py and benchmarks/mimic_vectors.py: corpus counts of the titles'
pieces, and word vectors of rare pieces blended with a map from their characters."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.ft_fixtures import make_data_dir, make_model_dir, make_vocab
from tibnlp.text.vocab import Vocabulary

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
coverage = runpy.run_path(str(BENCH / "corpus_coverage.py"))
mimic = runpy.run_path(str(BENCH / "mimic_vectors.py"))
WORD = "embeddings.word.weight"  # an encoder-only model folder


def _corpus(folder: Path, rows: list[list[int]]) -> Path:
    """A pretraining output's tokenised corpus (`data/dataset`, its train split)."""
    import datasets

    train = datasets.Dataset.from_dict({"input_ids": rows})
    datasets.DatasetDict({"train": train, "heldout": train}).save_to_disk(
        str(folder / "data" / "dataset")
    )
    return folder


def _run(script: dict, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["script", *argv])
    script["main"]()


def test_corpus_counts_add_up_every_piece(tmp_path: Path) -> None:
    out = _corpus(tmp_path / "pre", [[2, 5, 5, 3], [2, 7, 3]])
    counts = coverage["corpus_counts"](out, 9)
    assert counts.tolist() == [0, 0, 2, 2, 0, 2, 0, 1, 0]
    with pytest.raises(Exception, match="does not exist"):
        coverage["corpus_counts"](tmp_path / "nothing", 9)


def test_coverage_reports_the_buckets_of_the_test_pieces(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("TIBNLP_DATA", str(make_data_dir(tmp_path / "data")))
    vocab_dir = make_vocab(tmp_path / "vocab")
    size = Vocabulary.load(vocab_dir).size
    out = _corpus(tmp_path / "pre", [list(range(size))] * 3)  # every piece 3 times
    _run(coverage, [str(out), "--vocab", str(vocab_dir)], monkeypatch)
    printed = capsys.readouterr().out
    assert "test title pieces:" in printed and "| 20 or more |" in printed
    assert "| 3 |" in printed  # the median corpus count of a bucket


def test_character_ngrams_mark_the_ends_and_the_word_start() -> None:
    grams = mimic["ngrams"]("\u2581ཀཁ", (1, 2))
    assert grams == ["<", "ཀ", "ཁ", ">", "<ཀ", "ཀཁ", "ཁ>", "START"]
    assert mimic["ngrams"]("ཀ", (2,)) == ["<ཀ", "ཀ>", "INSIDE"]


def test_mimic_blends_only_the_rare_pieces(tmp_path, monkeypatch, capsys) -> None:
    vocab_dir = make_vocab(tmp_path / "vocab")
    vocab = Vocabulary.load(vocab_dir)
    torch.manual_seed(0)
    model = make_model_dir(tmp_path, vocab_dir)
    regular = [i for i in range(vocab.size) if i not in vocab.special_ids]
    frequent, rare = regular[: len(regular) // 2], regular[len(regular) // 2 :]
    pre = _corpus(tmp_path / "pre", [frequent * 4, rare[:1]])  # frequent: 4, one rare: 1
    out = tmp_path / "blended"
    argv = [str(model), str(out), "--corpus", str(pre), "--min-count", "4", "--k", "1"]
    _run(mimic, argv, monkeypatch)
    assert "blended" in capsys.readouterr().out
    before = load_file(str(model / "model.safetensors"))[WORD]
    after = load_file(str(out / "model.safetensors"))[WORD]
    assert torch.equal(after[frequent], before[frequent])
    assert not torch.equal(after[rare], before[rare])
    for i in sorted(vocab.special_ids):
        assert torch.equal(after[i], before[i])
    # a piece held once gets half its own vector and half the map's (k = 1)
    assert np.isfinite(after.numpy()).all()
    with pytest.raises(Exception, match="exists"):
        _run(mimic, argv, monkeypatch)
