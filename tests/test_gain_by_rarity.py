"""benchmarks/gain_by_rarity.py: a lead split by how well the training titles cover each test
title's pieces (its rarest one, or the share of rare ones)."""

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


def _systems(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **runs: tuple[str, str]
) -> tuple[Path, dict[str, Path]]:
    """Tiny TextCNN fine-tunings on a test data directory, one per `name=(seeds, lr)`: the
    vocabulary and each run's system folder."""
    monkeypatch.setenv("TIBNLP_DATA", str(make_data_dir(tmp_path / "data")))
    vocab = make_vocab(tmp_path / "vocab")
    folders = {}
    for name, (seeds, lr) in runs.items():
        overrides = tiny_textcnn(
            vocab, tmp_path / name, f"finetune.seeds={seeds}", "finetune.epochs=1",
            f"finetune.optimizer.lr={lr}",
        )  # fmt: skip
        folders[name] = run_finetune(load_config(None, overrides), "tncc").seeds[0].directory.parent
    return vocab, folders


def test_rarest_counts_read_the_least_covered_piece() -> None:
    train = [{1, 2}, {1, 3}, {1}]
    items = [{1}, {1, 2}, {3, 4}, set()]
    # piece 1 is in 3 titles, 2 and 3 in one each, 4 in none; no piece: fully covered
    assert gain["rarest_counts"](train, items).tolist() == [3, 1, 0, 4]


def test_rare_shares_count_pieces_below_the_threshold() -> None:
    train = [{1, 2}, {1, 3}, {1}]
    items = [{1}, {1, 2}, {2, 3, 4, 1}, set()]
    # below 2: pieces 2, 3 (one title each) and 4 (none) are rare, piece 1 (three) is not
    shares = gain["rare_shares"](train, items, below=2)
    assert shares.tolist() == [0.0, 0.5, 0.75, 0.0]
    buckets, names = gain["share_buckets"](np.array([0.0, 0.1, 0.2, 0.25, 1.0]))
    assert buckets.tolist() == [0, 1, 1, 2, 2]  # the cut (0.2) belongs to the lower bucket
    assert names == ["none", "over 0, up to 20 %", "over 20 %"]


def test_buckets_follow_their_edges() -> None:
    counts = np.array([0, 1, 4, 5, 19, 20, 300])
    assert gain["bucket_of"](counts, (0, 1, 5, 20)).tolist() == [0, 1, 1, 2, 2, 3, 3]
    assert gain["bucket_names"]((0, 1, 5, 20)) == ["0", "1-4", "5-19", ">= 20"]


@pytest.mark.parametrize("split", ["rarest", "share"])
def test_buckets_add_up_to_the_whole_lead(
    split: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # two systems that predict differently
    vocab, runs = _systems(tmp_path, monkeypatch, a=("[1,2]", "0.01"), b=("[1,2]", "0.0003"))
    systems = [runs["a"], runs["b"]]
    argv = [str(SCRIPT), *map(str, systems), "--vocab", str(vocab), "--resamples", "50"]
    monkeypatch.setattr(sys, "argv", [*argv, "--by", split])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    out = capsys.readouterr().out.splitlines()
    head = next(line for line in out if line.startswith("tncc-title test:"))
    lead = float(re.search(r"lead in accuracy ([+-][\d.]+) points", head)[1])  # type: ignore[index]
    header = next(line for line in out if line.startswith("| ") and "titles |" in line)
    assert header.startswith("| share of pieces" if split == "share" else "| rarest piece")
    rows = [line.split("|")[1:-1] for line in out if re.match(r"\| (\d|>|none|over)", line)]
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


def test_no_lead_gives_no_share_of_it() -> None:
    """Two systems right on as many items lead by nothing: each bucket's share is "-", not a
    division by zero printed as "nan %"."""
    assert gain["lead_share"](3.0, 0.0) == "-"
    assert gain["lead_share"](-1.0, 4.0) == "-25 %"


def test_items_of_another_split_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    vocab, runs = _systems(tmp_path, monkeypatch, a=("[1]", "0.01"))
    system = runs["a"]
    results = json.loads((system / "results.json").read_text(encoding="utf-8"))
    results["targets"]["test"] = results["targets"]["test"][::-1]
    other = tmp_path / "other"
    other.mkdir()
    (other / "results.json").write_text(json.dumps(results), encoding="utf-8")
    argv = [str(SCRIPT), str(system), str(other), "--vocab", str(vocab), "--resamples", "50"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit, match="differ in their items"):
        runpy.run_path(str(SCRIPT), run_name="__main__")


def test_pooled_runs_add_their_seeds_to_system_a(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    vocab, runs = _systems(
        tmp_path,
        monkeypatch,
        a=("[1,2]", "0.01"),
        pool=("[3]", "0.01"),
        b=("[1]", "3e-4"),
        b2=("[2]", "3e-4"),
    )
    # the pooled run given before the twin: one path per --pool, so B is not taken for one
    argv = [str(SCRIPT), str(runs["a"]), "--pool", str(runs["pool"]), str(runs["b"])]
    monkeypatch.setattr(sys, "argv", [*argv, "--vocab", str(vocab), "--resamples", "50"])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    head = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("tncc-title test:"))
    assert "(3 seeds)" in head and "(1 seed)" in head
    results = {
        k: json.loads((v / "results.json").read_text(encoding="utf-8")) for k, v in runs.items()
    }
    y = np.array(results["a"]["targets"]["test"])
    seeds_a = results["a"]["seeds"] + results["pool"]["seeds"]
    acc_a = np.mean([np.array(s["predictions"]["test"]) == y for s in seeds_a])
    acc_b = np.mean(np.array(results["b"]["seeds"][0]["predictions"]["test"]) == y)
    lead = float(re.search(r"lead in accuracy ([+-][\d.]+) points", head)[1])  # type: ignore[index]
    assert lead == pytest.approx(100 * (acc_a - acc_b), abs=0.006)
    # --pool-b: more runs of the twin's system join B's mean the same way
    pooled_b = [*argv, "--pool-b", str(runs["b2"])]
    monkeypatch.setattr(sys, "argv", [*pooled_b, "--vocab", str(vocab), "--resamples", "50"])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    head = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("tncc-title test:"))
    assert "(3 seeds)" in head and "(2 seeds)" in head
    seeds_b = results["b"]["seeds"] + results["b2"]["seeds"]
    acc_b = np.mean([np.array(s["predictions"]["test"]) == y for s in seeds_b])
    lead = float(re.search(r"lead in accuracy ([+-][\d.]+) points", head)[1])  # type: ignore[index]
    assert lead == pytest.approx(100 * (acc_a - acc_b), abs=0.006)
