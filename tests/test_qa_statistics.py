"""The statistics behind every published figure, against small independent references:
P/R/F1 with classes absent from either side, the seed spread, the paired bootstrap of
`tibnlp finetune compare` (pooled or not), and the inputs of `benchmarks/seed_ensemble.py`
and `benchmarks/gain_by_rarity.py`."""

from __future__ import annotations

import json
import runpy
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sklearn.metrics import f1_score, precision_recall_fscore_support
from typer.testing import CliRunner

from tests.ft_fixtures import LABELS as FT_LABELS
from tests.ft_fixtures import make_data_dir, make_vocab
from tibnlp.cli.main import app
from tibnlp.data.labelled import model_text
from tibnlp.data.tasks import load_tncc
from tibnlp.errors import DataError
from tibnlp.evaluation.metrics import aggregate, compute_metrics
from tibnlp.evaluation.report import markdown_table
from tibnlp.evaluation.significance import (
    compare_rows,
    paired_bootstrap,
    pool_rows,
    resampled_scores,
)
from tibnlp.evaluation.spread import mean_std
from tibnlp.text.vocab import Vocabulary
from tibnlp.tracking.compare import Cell

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
L = 5  # labels of the synthetic predictions


def reference_prf(true: np.ndarray, pred: np.ndarray, n: int) -> dict[str, float]:
    """Macro and weighted P/R/F1 from per-class counts, every undefined ratio 0 (no sklearn)."""
    tp = np.array([np.sum((true == c) & (pred == c)) for c in range(n)], dtype=float)
    fp = np.array([np.sum((true != c) & (pred == c)) for c in range(n)], dtype=float)
    fn = np.array([np.sum((true == c) & (pred != c)) for c in range(n)], dtype=float)

    def ratio(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.divide(a, b, out=np.zeros(n), where=b > 0)

    p, r, f = ratio(tp, tp + fp), ratio(tp, tp + fn), ratio(2 * tp, 2 * tp + fp + fn)
    support = tp + fn
    out = {"accuracy": float(np.mean(true == pred))}
    for name, v in (("precision", p), ("recall", r), ("f1", f)):
        out[f"macro_{name}"] = float(v.mean())
        out[f"weighted_{name}"] = float((v * support).sum() / support.sum())
    return out


def synthetic(n: int, seed: int, right: float = 0.6) -> tuple[np.ndarray, np.ndarray]:
    """Gold ids of classes 0-2 only (3 and 4 never occur) and a noisy prediction that also
    predicts class 4 (absent from gold) and never class 3 (absent from both)."""
    rng = np.random.default_rng(seed)
    true = rng.integers(0, 3, n)
    pred = np.where(rng.random(n) < right, true, rng.choice([0, 1, 2, 4], n))
    return true, pred


# --- P/R/F1 ---------------------------------------------------------------------------------


def test_metrics_match_the_reference_and_sklearn_with_absent_classes() -> None:
    true, pred = synthetic(200, 0)
    pred[true == 1] = 0  # class 1: in gold, never predicted
    assert 4 in pred and 3 not in pred and 4 not in true
    got = compute_metrics(true.tolist(), pred.tolist(), [f"c{i}" for i in range(L)]).summary
    want = reference_prf(true, pred, L)
    for key, value in want.items():
        assert got[key] == pytest.approx(value, abs=1e-12), key
    p, r, f, _ = precision_recall_fscore_support(
        true, pred, labels=range(L), average="macro", zero_division=0
    )
    assert (got["macro_precision"], got["macro_recall"], got["macro_f1"]) == pytest.approx(
        (p, r, f), abs=1e-12
    )
    # the bootstrap's own scorer on the full item set is the same number
    full = np.arange(len(true))[None, :]
    for metric in ("macro_f1", "weighted_f1", "accuracy"):
        score = resampled_scores(true, pred, full, L, metric)[0]
        assert score == pytest.approx(want[metric], abs=1e-12), metric


# --- the seed spread ------------------------------------------------------------------------


def test_every_printed_spread_is_the_sample_std() -> None:
    scores = [0.601, 0.622, 0.598]
    sample = float(np.std(scores, ddof=1))
    assert sample != pytest.approx(float(np.std(scores)))  # the two differ at three seeds
    assert mean_std(scores) == pytest.approx((np.mean(scores), sample), abs=1e-15)
    agg = aggregate([{"macro_f1": s} for s in scores])["macro_f1"]
    assert agg == pytest.approx((np.mean(scores), sample), abs=1e-15)
    assert Cell(list(scores)).std == pytest.approx(sample, abs=1e-15)  # `runs compare`
    row = {
        "dataset": "d",
        "system": "s",
        "seeds": [{}, {}, {}],
        "aggregate": {"test": {"macro_f1": {"mean": agg[0], "std": agg[1]}}},
    }
    assert f"{100 * np.mean(scores):.2f} ± {100 * sample:.2f}" in markdown_table([row])


# --- the paired bootstrap -------------------------------------------------------------------


_REAL_RNG = np.random.default_rng


class _Recording:
    """A numpy Generator that keeps every index matrix it draws."""

    def __init__(self, seed: int) -> None:
        self.rng = _REAL_RNG(seed)
        self.drawn: list[np.ndarray] = []

    def integers(self, *args: Any, **kwargs: Any) -> np.ndarray:
        out = self.rng.integers(*args, **kwargs)
        self.drawn.append(out)
        return out


def _macro(true: np.ndarray, pred: np.ndarray) -> float:
    return float(f1_score(true, pred, labels=range(L), average="macro", zero_division=0))


def test_bootstrap_resamples_items_jointly_and_takes_percentiles_of_mean_differences(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    true, _ = synthetic(120, 1)
    a = [synthetic(120, 1, right)[1] for right in (0.7, 0.75, 0.8)]
    b = [synthetic(120, 1, right)[1] for right in (0.55, 0.6)]
    made: list[_Recording] = []

    def recording(seed: int) -> _Recording:
        made.append(_Recording(seed))
        return made[-1]

    monkeypatch.setattr(np.random, "default_rng", recording)
    d = paired_bootstrap(true, a, b, L, resamples=300, seed=7)
    monkeypatch.setattr(np.random, "default_rng", _REAL_RNG)
    (rng,) = made  # one generator, seeded as asked
    index = np.concatenate(rng.drawn)
    assert index.shape == (300, 120)  # every resample draws 120 items, with replacement
    # one index row serves both systems and every seed: the difference of seed-mean macro-F1
    diffs = np.array(
        [
            np.mean([_macro(true[i], p[i]) for p in a])
            - np.mean([_macro(true[i], p[i]) for p in b])
            for i in index
        ]
    )
    assert (d.low, d.high) == pytest.approx(tuple(np.quantile(diffs, [0.025, 0.975])), abs=1e-12)
    assert d.not_above == pytest.approx(float(np.mean(diffs <= 0)))
    full = np.mean([_macro(true, p) for p in a]) - np.mean([_macro(true, p) for p in b])
    assert d.diff == pytest.approx(full, abs=1e-12)
    assert d.a == pytest.approx(np.mean([_macro(true, p) for p in a]), abs=1e-12)
    # macro-F1 is no mean over items: the mean of per-item "differences" is another number
    per_item = np.mean([np.mean(p == true) for p in a]) - np.mean([np.mean(p == true) for p in b])
    assert abs(per_item - d.diff) > 1e-3


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_interval_holds_the_observed_difference_and_reproduces(seed: int) -> None:
    true, base = synthetic(150, seed)
    better = np.where(np.arange(150) % 5 == 0, true, base)
    d = paired_bootstrap(true, [better, base], [base], L, resamples=400)
    assert d.low <= d.diff <= d.high
    assert paired_bootstrap(true, [better, base], [base], L, resamples=400) == d
    other = paired_bootstrap(true, [better, base], [base], L, resamples=400, seed=1)
    assert (other.low, other.high) != (d.low, d.high) and other.diff == d.diff


def _row(system: str, true: np.ndarray, preds: list[np.ndarray], **extra: Any) -> dict[str, Any]:
    return {
        "system": system,
        "dataset": "tncc-title",
        "seeds": [
            {"seed": i + 1, "predictions": {"test": p.tolist()}} for i, p in enumerate(preds)
        ],
        "aggregate": {},
        "targets": {"test": true.tolist()},
        "labels": [f"c{i}" for i in range(L)],
        "notes": {},
        **extra,
    }


def test_pooled_runs_give_the_mean_over_every_seed_pair() -> None:
    true, _ = synthetic(150, 4)
    a1 = [synthetic(150, 4, r)[1] for r in (0.7, 0.8)]
    a2 = [synthetic(150, 4, 0.75)[1]]
    b = [synthetic(150, 4, r)[1] for r in (0.5, 0.6, 0.65)]
    pooled = pool_rows([_row("albert-pretrained(m1)+cnn", true, a1),
                        _row("albert-pretrained(m2)+cnn", true, a2)], "test")  # fmt: skip
    d = compare_rows(pooled, _row("albert-random(m1)+cnn", true, b))
    pairs = [_macro(true, x) - _macro(true, y) for x in a1 + a2 for y in b]
    assert d.diff == pytest.approx(np.mean(pairs), abs=1e-12)  # each seed weighs the same
    # with as many seeds on both sides it is also the mean of seed-k against seed-k
    same = paired_bootstrap(true, a1 + a2, b, L, resamples=100)
    paired = np.mean([_macro(true, x) - _macro(true, y) for x, y in zip(a1 + a2, b, strict=True)])
    assert same.diff == pytest.approx(paired, abs=1e-12)


def test_rows_of_other_items_or_label_orders_are_refused(tmp_path: Path) -> None:
    true, pred = synthetic(90, 5)
    a = _row("sys-a", true, [pred])
    reordered = [f"c{i}" for i in (1, 0, 2, 3, 4)]  # the same classes, numbered otherwise
    swap = np.array([1, 0, 2, 3, 4])
    b = _row("sys-b", swap[true], [swap[pred]], labels=reordered)
    with pytest.raises(DataError, match="number their labels differently"):
        compare_rows(a, b)
    shuffled = _row("sys-b", true[::-1].copy(), [pred[::-1].copy()])
    with pytest.raises(DataError, match="not scored on the same test items"):
        compare_rows(a, shuffled)
    with pytest.raises(DataError, match="different datasets"):
        compare_rows(a, {**_row("sys-b", true, [pred]), "dataset": "tncc-title-v2"})
    with pytest.raises(DataError, match="one prediction per item"):
        paired_bootstrap(true, [pred], [pred[:-1]], L)
    with pytest.raises(DataError, match="cannot be pooled"):
        pool_rows([a, _row("sys-a", swap[true], [swap[pred]], labels=reordered)], "test")
    for name, row in (("a", a), ("b", b)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(row), "utf-8")
    out = CliRunner().invoke(app, ["finetune", "compare", str(tmp_path / "a"), str(tmp_path / "b")])
    assert out.exit_code != 0 and "number their labels differently" in str(out.exception)


# --- benchmarks/seed_ensemble.py ------------------------------------------------------------


def test_the_ensemble_reads_the_seeds_its_results_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ensemble = runpy.run_path(str(BENCH / "seed_ensemble.py"))
    system = tmp_path / "system"
    for seed in (1, 2, 3):  # seed-3: left by an earlier run of this folder with more seeds
        (system / f"seed-{seed}").mkdir(parents=True)
        (system / f"seed-{seed}" / "classifier.yaml").write_text("labels: []\n")
    true, pred = synthetic(20, 6)
    (system / "results.json").write_text(json.dumps(_row("s", true, [pred, pred])), "utf-8")
    assert [p.name for p in ensemble["seed_folders"](system)] == ["seed-1", "seed-2"]
    (system / "seed-2" / "classifier.yaml").unlink()
    with pytest.raises(SystemExit, match="missing \\(seed-2\\)"):
        ensemble["seed_folders"](system)
    (system / "results.json").unlink()  # classifiers without a result: every seed folder
    assert [p.name for p in ensemble["seed_folders"](system)] == ["seed-1", "seed-3"]


# --- benchmarks/gain_by_rarity.py -----------------------------------------------------------

NOVEL = "ཞྭ"  # a syllable of no training title (nor of the tiny vocabulary)


def _rarity_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Vocabulary]:
    """The tiny data directory, with NOVEL in every validation title and the first 4 test
    titles (so a count over more than the training titles would see it), and a vocabulary."""
    root = make_data_dir(tmp_path / "data")
    for split, first in (("validation", None), ("test", 4)):
        path = root / "tncc" / f"tncc_title_{split}.jsonl"
        records = [json.loads(x) for x in path.read_text("utf-8").splitlines()]
        for r in records[:first]:
            r["text"] += f" {NOVEL}"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), "utf-8")
    monkeypatch.setenv("TIBNLP_DATA", str(root))
    vocab = make_vocab(tmp_path / "vocab")
    return vocab, Vocabulary.load(vocab)


def _rarity_row(system: str, seeds: int, vocab: Vocabulary, **notes: Any) -> dict[str, Any]:
    data = load_tncc("title")
    true = np.array(data.targets("test"))
    row = _row(system, true, [(true + s) % len(FT_LABELS) for s in range(seeds)])
    return {**row, "labels": list(FT_LABELS), "notes": {"vocab_sha256": vocab.sha256, **notes}}


def _write(tmp_path: Path, name: str, row: dict[str, Any]) -> Path:
    (tmp_path / name).mkdir()
    (tmp_path / name / "results.json").write_text(json.dumps(row), "utf-8")
    return tmp_path / name


def test_rarity_counts_only_the_training_titles_the_systems_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    vocab_dir, vocab = _rarity_env(tmp_path, monkeypatch)
    gain = runpy.run_path(str(BENCH / "gain_by_rarity.py"))
    a = _write(tmp_path, "a", _rarity_row("sys-a", 2, vocab))
    b = _write(tmp_path, "b", _rarity_row("sys-b", 1, vocab))
    argv = [str(BENCH / "gain_by_rarity.py"), str(a), str(b), "--vocab", str(vocab_dir)]
    monkeypatch.setattr(sys, "argv", [*argv, "--resamples", "50"])
    runpy.run_path(str(BENCH / "gain_by_rarity.py"), run_name="__main__")
    rows = [
        x.split("|")[1:-1] for x in capsys.readouterr().out.splitlines() if x.startswith("| 0 ")
    ]
    assert [int(r[1]) for r in rows] == [4]  # NOVEL's titles: in 30 validation titles, no train
    # finetune.limit_train: the first N training titles, the ones the systems were tuned on
    data = load_tncc("title")
    rows_9 = [_rarity_row(s, 1, vocab, sizes={"train": 9}) for s in ("a", "b")]
    train, test = gain["model_texts"](rows_9, data, vocab, "test")
    assert train == data.texts("train")[:9] and test == data.texts("test")
    with pytest.raises(SystemExit, match="numbers of training titles"):
        full = _rarity_row("b", 1, vocab, sizes={"train": 90})
        gain["model_texts"]([rows_9[0], full], data, vocab, "test")
    # the systems' input form: closing marks trimmed as their classifiers read the titles
    data.splits["train"][0] = replace(data.splits["train"][0], text=data.texts("train")[0] + "།")
    trimmed = _rarity_row("a", 1, vocab, input_form="tsheg-trimmed (spaces between syllables)")
    train, _ = gain["model_texts"]([trimmed], data, vocab, "test")
    assert train[0] == model_text(data.splits["train"][0].text, "tsheg-trimmed")
    assert not train[0].endswith("།")


def test_rarity_refuses_another_vocabulary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    vocab_dir, vocab = _rarity_env(tmp_path, monkeypatch)
    a = _write(tmp_path, "a", _rarity_row("sys-a", 1, vocab))
    b = _write(tmp_path, "b", {**_rarity_row("sys-b", 1, vocab), "notes": {"vocab_sha256": "0f"}})
    argv = [str(BENCH / "gain_by_rarity.py"), str(a), str(b), "--vocab", str(vocab_dir)]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit, match="differ in their vocabularies"):
        runpy.run_path(str(BENCH / "gain_by_rarity.py"), run_name="__main__")
    for name in ("c", "d"):  # both read one vocabulary, not the one given
        _write(tmp_path, name, {**_rarity_row(name, 1, vocab), "notes": {"vocab_sha256": "0f"}})
    argv = [str(BENCH / "gain_by_rarity.py"), str(tmp_path / "c"), str(tmp_path / "d")]
    monkeypatch.setattr(sys, "argv", [*argv, "--vocab", str(vocab_dir)])
    with pytest.raises(SystemExit, match="not the vocabulary the systems read"):
        runpy.run_path(str(BENCH / "gain_by_rarity.py"), run_name="__main__")


def test_two_folders_of_one_name_are_neither_compared_nor_pooled() -> None:
    """Folder sets are named by their folder: rows of ./mine and b/mine share the dataset
    name, and their items can match in number and labels; the recorded folder tells them
    apart."""
    true, pred = synthetic(120, 4)
    mine = _row("a", true, [pred], dataset="mine", notes={"dataset_folder": "/x/mine"})
    other = _row("b", true, [pred], dataset="mine", notes={"dataset_folder": "/y/mine"})
    with pytest.raises(DataError, match="read different sets named mine"):
        compare_rows(mine, other)
    with pytest.raises(DataError, match="cannot be pooled"):
        pool_rows([mine, {**other, "system": "a"}], "test")
    assert compare_rows(mine, {**mine, "system": "b"}).diff == 0.0
