"""benchmarks/gain_by_rarity.py: a lead split by how well the training titles cover each test
title's rarest piece."""

from __future__ import annotations

import json
import re
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.ft_fixtures import make_data_dir, make_vocab, tiny_textcnn
from tibnlp.config import load_config
from tibnlp.training.finetune import run_finetune

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gain_by_rarity.py"
gain = runpy.run_path(str(SCRIPT))  # its functions, without running main


def test_rarest_counts_read_the_least_covered_piece() -> None:
    train = [{1, 2}, {1, 3}, {1}]
    items = [{1}, {1, 2}, {3, 4}, set()]
    # piece 1 is in 3 titles, 2 and 3 in one each, 4 in none; no piece: fully covered
    assert gain["rarest_counts"](train, items).tolist() == [3, 1, 0, 4]


def test_buckets_follow_their_edges() -> None:
    counts = np.array([0, 1, 4, 5, 19, 20, 300])
    assert gain["bucket_of"](counts, (0, 1, 5, 20)).tolist() == [0, 1, 1, 2, 2, 3, 3]
    assert gain["bucket_names"]((0, 1, 5, 20)) == ["0", "1-4", "5-19", ">= 20"]


def test_buckets_add_up_to_the_whole_lead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = make_data_dir(tmp_path / "data")
    monkeypatch.setenv("TIBNLP_DATA", str(root))
    vocab = make_vocab(tmp_path / "vocab")
    systems = []
    for name, lr in (("a", "0.01"), ("b", "0.0003")):  # two systems that predict differently
        overrides = tiny_textcnn(
            vocab, tmp_path / name, "finetune.seeds=[1,2]", "finetune.epochs=1",
            f"finetune.optimizer.lr={lr}",
        )  # fmt: skip
        systems.append(run_finetune(load_config(None, overrides), "tncc").seeds[0].directory.parent)
    argv = [str(SCRIPT), *map(str, systems), "--vocab", str(vocab), "--resamples", "50"]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_path(str(SCRIPT), run_name="__main__")
    out = capsys.readouterr().out.splitlines()
    head = next(line for line in out if line.startswith("tncc-title test:"))
    lead = float(re.search(r"lead in accuracy ([+-][\d.]+) points", head)[1])  # type: ignore[index]
    rows = [line.split("|")[1:-1] for line in out if re.match(r"\| (\d|>)", line)]
    titles = [int(r[1]) for r in rows]
    assert sum(titles) == 30  # every test title in one bucket
    # the buckets' accuracy differences, weighted by their sizes, are the whole lead
    diffs = [float(r[4].split()[0]) for r in rows]
    assert sum(n * d for n, d in zip(titles, diffs, strict=True)) / 30 == pytest.approx(
        lead, abs=0.02
    )
    # the whole lead from the results files by hand
    results = [json.loads((s / "results.json").read_text(encoding="utf-8")) for s in systems]
    y = np.array(results[0]["targets"]["test"])
    acc = [np.mean([np.array(s["predictions"]["test"]) == y for s in r["seeds"]]) for r in results]
    assert lead == pytest.approx(100 * (acc[0] - acc[1]), abs=0.006)
    if lead:
        assert sum(float(r[5].rstrip(" %")) for r in rows) == pytest.approx(100, abs=len(rows))


def test_items_of_another_split_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_data_dir(tmp_path / "data")
    monkeypatch.setenv("TIBNLP_DATA", str(root))
    vocab = make_vocab(tmp_path / "vocab")
    overrides = tiny_textcnn(vocab, tmp_path / "a", "finetune.seeds=[1]", "finetune.epochs=1")
    system = run_finetune(load_config(None, overrides), "tncc").seeds[0].directory.parent
    results = json.loads((system / "results.json").read_text(encoding="utf-8"))
    results["targets"]["test"] = results["targets"]["test"][::-1]
    other = tmp_path / "other"
    other.mkdir()
    (other / "results.json").write_text(json.dumps(results), encoding="utf-8")
    argv = [str(SCRIPT), str(system), str(other), "--vocab", str(vocab), "--resamples", "50"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit, match="differ in their items"):
        runpy.run_path(str(SCRIPT), run_name="__main__")
