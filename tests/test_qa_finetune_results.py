"""QA of fine-tuning's result side: results.json, `finetune report`, `finetune compare`
(paired bootstrap, --pool), the AdvTS parts, and what a rerun leaves in a result folder."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, f1_score
from typer.testing import CliRunner

from tests.ft_fixtures import make_data_dir, make_vocab, tiny_textcnn
from tibnlp.cli.main import app
from tibnlp.config import load_config
from tibnlp.errors import DataError
from tibnlp.evaluation.result_loader import load_results
from tibnlp.evaluation.significance import compare_rows, pool_rows
from tibnlp.training import finetune as ft_mod
from tibnlp.training import finetune_seeds as seeds_mod
from tibnlp.training.finetune import run_finetune

LABELS = ["a", "b", "c"]


def _row(system: str = "sys", dataset: str = "d", seed_preds: int = 2, **notes: object) -> dict:
    """A results.json row as `summary_dict` writes it, on 12 test items of 3 classes."""
    rng = np.random.default_rng(len(system) + seed_preds)
    true = [i % 3 for i in range(12)]
    seeds = []
    for s in range(seed_preds):
        pred = [t if rng.random() < 0.7 else int(rng.integers(0, 3)) for t in true]
        f1 = float(f1_score(true, pred, average="macro"))
        seeds.append(
            {
                "seed": s + 1,
                "metrics": {"test": {"macro_f1": f1}, "validation": {"macro_f1": f1}},
                "predictions": {"test": pred},
            }
        )
    return {
        "system": system,
        "dataset": dataset,
        "seeds": seeds,
        "targets": {"test": true},
        "labels": list(LABELS),
        "aggregate": {"test": {"macro_f1": {"mean": 0.5, "std": 0.1}}},
        "notes": {"validation_majority_macro_f1": 0.2, "sizes": {"train": 90}, **notes},
    }


def _damage(row: dict, change: str) -> dict:
    row = copy.deepcopy(row)
    seed = row["seeds"][0]
    if change == "seed_not_object":
        row["seeds"][0] = 5
    elif change == "notes_string":
        row["notes"] = "x"
    elif change == "majority_string":
        row["notes"]["validation_majority_macro_f1"] = "x"
    elif change == "seed_metric_string":
        seed["metrics"]["validation"]["macro_f1"] = "x"
    elif change == "prediction_string":
        seed["predictions"]["test"][0] = "a"
    elif change == "targets_list":
        row["targets"] = [1, 2]
    elif change == "prediction_short":
        seed["predictions"]["test"].pop()
    elif change == "prediction_out_of_range":
        seed["predictions"]["test"][0] = 7
    elif change == "train_size_string":
        row["notes"]["sizes"]["train"] = "x"
    return row


DAMAGES = {
    "seed_not_object": r"seeds\[0\] is not an object",
    "notes_string": r"key 'notes' is not an object",
    "majority_string": r"notes\.validation_majority_macro_f1 is not a number",
    "seed_metric_string": r"seeds\[0\]\.metrics\.validation is not an object of numbers",
    "prediction_string": r"seeds\[0\]\.predictions\.test is not a list of label ids",
    "targets_list": r"key 'targets' is not an object of parts",
    "prediction_short": r"seeds\[0\]\.predictions\.test has 11 items, targets\.test 12",
    "prediction_out_of_range": r"seeds\[0\]\.predictions\.test holds a label id outside 0\.\.2",
    "train_size_string": r"notes\.sizes\.train is not a number",
}


@pytest.mark.parametrize("change", sorted(DAMAGES))
def test_a_damaged_seed_entry_is_named_not_a_traceback(tmp_path: Path, change: str) -> None:
    """A results.json edited by hand or cut short inside its seeds, notes, targets or
    predictions ended `finetune report` or `finetune compare` in an AttributeError, TypeError
    or ValueError traceback, or (short or out-of-range predictions) in an error that did not
    say which file: now the file and the bad key are named, exit 2."""
    good, bad = tmp_path / "good", tmp_path / "bad"
    for folder, row in ((good, _row("other")), (bad, _damage(_row(), change))):
        folder.mkdir()
        (folder / "results.json").write_text(json.dumps(row), "utf-8")
    with pytest.raises(DataError, match=DAMAGES[change]) as err:
        load_results([bad])
    assert str(bad / "results.json") in str(err.value)
    for args in (["report", str(bad)], ["compare", str(good), str(bad)]):
        out = CliRunner().invoke(app, ["finetune", *args])
        assert out.exit_code != 0, (args, out.output, out.exception)
        assert isinstance(out.exception, DataError), out.exception
        assert str(bad / "results.json") in str(out.exception)
    assert len(load_results([good])) == 1  # an undamaged row still loads


def test_older_and_minimal_results_still_load(tmp_path: Path) -> None:
    """The checks added above refuse damage only: rows without predictions, targets, labels or
    notes (results written before they were kept) load as before."""
    row = {"system": "s", "dataset": "d", "seeds": [{}, {"seed": 1, "metrics": {}}],
           "aggregate": {"test": {"macro_f1": {"mean": 0.5, "std": 0.01}}}}  # fmt: skip
    (tmp_path / "results.json").write_text(json.dumps(row), "utf-8")
    assert load_results([tmp_path]) == [row]


def test_pooling_refuses_runs_on_fewer_labelled_examples() -> None:
    """`--pool` took a run fine-tuned on 30 labelled examples (finetune.limit_train) as another
    run of the same system fine-tuned on all 90, and averaged their seeds into one score."""
    full, few = _row("albert-pretrained(m1)+cnn"), _row("albert-pretrained(m2)+cnn")
    few["notes"]["sizes"]["train"] = 30
    with pytest.raises(DataError, match="fine-tuned on 30 labelled examples"):
        pool_rows([full, few], "test")
    same = _row("albert-pretrained(m2)+cnn")
    assert len(pool_rows([full, same], "test")["seeds"]) == 4


def test_pooling_refuses_runs_with_another_label_list() -> None:
    """Runs with the same label ids but other label names were pooled: A's label list was then
    the first run's alone."""
    a, b = _row("albert-pretrained(m1)+cnn"), _row("albert-pretrained(m2)+cnn")
    b["labels"] = ["x", "y", "z"]
    with pytest.raises(DataError, match="cannot be pooled"):
        pool_rows([a, b], "test")


def test_compare_refuses_results_of_other_datasets(tmp_path: Path) -> None:
    """Two datasets whose test items have the same labels in the same order (two sets sorted
    by label, one set in two text forms) were compared, printed under A's dataset name only."""
    a, b = _row("sys-a", "tusa"), _row("sys-b", "shajiu_sentiment")
    with pytest.raises(DataError, match="different datasets"):
        compare_rows(a, b)
    for name, row in (("a", a), ("b", b)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(row), "utf-8")
    out = CliRunner().invoke(app, ["finetune", "compare", str(tmp_path / "a"), str(tmp_path / "b")])
    assert out.exit_code != 0 and "different datasets" in str(out.exception)
    assert compare_rows(a, {**b, "dataset": "tusa"}).items == 12


@pytest.fixture
def env(tmp_path, monkeypatch) -> SimpleNamespace:
    monkeypatch.setenv("TIBNLP_DATA", str(make_data_dir(tmp_path / "data")))
    return SimpleNamespace(tmp=tmp_path, vocab=make_vocab(tmp_path / "vocab"))


def _cfg(env: SimpleNamespace, out: str, *extra: str):
    return load_config(
        None, tiny_textcnn(env.vocab, env.tmp / out, "finetune.batch_size=16", *extra)
    )


def _bootstrap_sklearn(true, preds_a, preds_b, metric: str, resamples: int, seed: int):
    """The interval `finetune compare` reports, recomputed with scikit-learn on the same
    resamples (drawn as `paired_bootstrap` draws them: in chunks of 256)."""
    y, n = np.asarray(true), len(true)
    rng = np.random.default_rng(seed)
    index = np.concatenate(
        [rng.integers(0, n, size=(min(256, resamples - s), n)) for s in range(0, resamples, 256)]
    )
    labels = list(range(len(LABELS)))

    def score(pred, i):
        if metric == "accuracy":
            return accuracy_score(y[i], np.asarray(pred)[i])
        avg = metric.split("_")[0]
        return f1_score(y[i], np.asarray(pred)[i], labels=labels, average=avg, zero_division=0)

    diffs = np.array(
        [np.mean([score(p, i) for p in preds_a]) - np.mean([score(p, i) for p in preds_b])
         for i in index]
    )  # fmt: skip
    return np.quantile(diffs, 0.025), np.quantile(diffs, 0.975), (diffs <= 0).mean()


def test_reported_scores_and_intervals_agree_with_scikit_learn(env) -> None:
    """Every part's macro and weighted F1 of every seed (AdvTS included), their mean and sample
    std, and `compare`'s A - B and interval, recomputed from the saved predictions."""
    a = run_finetune(
        _cfg(env, "a", "finetune.seeds=[1,2]", "finetune.eval_also=[advts]"), "tncc"
    ).output
    b = run_finetune(
        _cfg(env, "b", "finetune.seeds=[3]", "finetune.eval_also=[advts]", "finetune.epochs=1"),
        "tncc",
    ).output
    row = json.loads((a / "results.json").read_text("utf-8"))
    assert set(row["targets"]) == {"validation", "test", "test_unseen", "advts_original", "advts"}
    for part, true in row["targets"].items():
        for avg in ("macro", "weighted"):
            values = [
                f1_score(true, s["predictions"][part], labels=[0, 1, 2], average=avg,
                         zero_division=0)
                for s in row["seeds"]
            ]  # fmt: skip
            assert [s["metrics"][part][f"{avg}_f1"] for s in row["seeds"]] == pytest.approx(values)
            agg = row["aggregate"][part][f"{avg}_f1"]
            assert agg["mean"] == pytest.approx(np.mean(values))
            assert agg["std"] == pytest.approx(np.std(values, ddof=1))
    row_b = json.loads((b / "results.json").read_text("utf-8"))
    assert row_b["aggregate"]["test"]["macro_f1"]["std"] == 0.0  # one seed: no spread
    for part, metric in (("test", "macro_f1"), ("advts", "weighted_f1")):
        d = compare_rows(row, row_b, part, metric, resamples=300, seed=5)
        preds_a = [s["predictions"][part] for s in row["seeds"]]
        preds_b = [s["predictions"][part] for s in row_b["seeds"]]
        low, high, not_above = _bootstrap_sklearn(
            row["targets"][part], preds_a, preds_b, metric, 300, 5
        )
        assert (d.low, d.high, d.not_above) == pytest.approx((low, high, not_above))
        mean_a = row["aggregate"][part][metric]["mean"]
        assert d.a == pytest.approx(mean_a)
        assert d.diff == pytest.approx(mean_a - row_b["aggregate"][part][metric]["mean"])


def test_a_rerun_that_replaces_seeds_leaves_no_stale_results(env, monkeypatch, capsys) -> None:
    """A rerun with other settings replaced the seed folders one by one; stopped before its
    end, it left the earlier run's results.json and results.md beside the new classifiers, and
    `finetune report` gave the old scores and recipe as this folder's result."""
    first = run_finetune(_cfg(env, "runs", "finetune.seeds=[1,2]"), "tncc")
    results = first.output / "results.json"
    assert results.is_file() and (first.output / "results.md").is_file()

    # adding seeds to a finished run keeps its results until the new ones replace them
    calls = {"n": 0}
    real = ft_mod.train_one_seed

    def stop(*args, **kwargs):
        calls["n"] += 1
        raise KeyboardInterrupt

    monkeypatch.setattr(ft_mod, "train_one_seed", stop)
    with pytest.raises(KeyboardInterrupt):
        run_finetune(_cfg(env, "runs", "finetune.seeds=[1,2,3]"), "tncc")
    assert calls["n"] == 1 and results.is_file()  # seeds 1, 2 reported, seed 3 cut short

    # other settings: seed 1 is replaced, and the old results go with it
    with pytest.raises(KeyboardInterrupt):
        run_finetune(_cfg(env, "runs", "finetune.seeds=[1,2]", "finetune.dropout=0.3"), "tncc")
    assert not results.exists() and not (first.output / "results.md").exists()
    assert "is from other settings" in capsys.readouterr().err
    monkeypatch.setattr(ft_mod, "train_one_seed", real)
    again = run_finetune(_cfg(env, "runs", "finetune.seeds=[1,2]", "finetune.dropout=0.3"), "tncc")
    assert json.loads(results.read_text("utf-8"))["notes"]["recipe"]["dropout"] == 0.3
    assert again.output == first.output


def test_a_record_whose_classifier_is_gone_says_why_it_is_retrained(env, capsys) -> None:
    """A seed recorded before predictions were kept, whose classifier was deleted, was trained
    again with "is from other settings, weights or data": the settings were the same."""
    cfg = _cfg(env, "runs", "finetune.epochs=1")
    seed_dir = run_finetune(cfg, "tncc").seeds[0].directory
    record = json.loads((seed_dir / seeds_mod.SEED_FILE).read_text())
    for m in record["metrics"].values():
        m.pop("targets"), m.pop("predictions")
    (seed_dir / seeds_mod.SEED_FILE).write_text(json.dumps(record))
    (seed_dir / "model.safetensors").unlink()
    capsys.readouterr()
    again = run_finetune(cfg, "tncc")
    err = capsys.readouterr().err
    assert "its classifier is missing or no longer gives the recorded scores" in err, err
    assert "other settings" not in err
    assert again.seeds[0].metrics["test"].predictions  # trained again, with predictions


def test_compare_marks_a_system_whose_seeds_did_not_learn(tmp_path: Path) -> None:
    """`finetune report`, `runs compare` and `runs plot` mark seeds stuck at the majority
    class as not a result; `finetune compare` printed a significant gain over such a system."""
    a, b = _row("sys-a"), _row("sys-b")
    for seed in b["seeds"]:
        seed["metrics"]["validation"]["macro_f1"] = 0.2  # the majority-class level
    for name, row in (("a", a), ("b", b)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(row), "utf-8")
    out = CliRunner().invoke(
        app,
        ["finetune", "compare", str(tmp_path / "a"), str(tmp_path / "b")],
        env={"COLUMNS": "300"},
    )
    assert out.exit_code == 0, out.output
    assert "B sys-b (NOT LEARNING: 2/2 seeds at majority class)" in out.output
    assert "warning: B has seeds that did not learn" in out.output
    assert "A sys-a:" in out.output  # the other side unmarked


def _report_lines(*paths: Path) -> list[str]:
    out = CliRunner().invoke(app, ["finetune", "report", *map(str, paths)])
    assert out.exit_code == 0, (out.output, out.exception)
    return out.output.splitlines()


def test_report_tells_apart_two_runs_of_one_system(tmp_path: Path) -> None:
    """Two result folders of one system (two pretraining seeds' encoders of one folder name,
    or one encoder fine-tuned with other settings) were two rows that read the same: each row
    now names its result folder, by as much of its path as tells it from the others'."""
    runs = [tmp_path / "seed1" / "enc" / "ft", tmp_path / "seed2" / "enc" / "ft"]
    for run, mean in zip(runs, (0.41, 0.57), strict=True):
        row = _row("albert-pretrained(enc)+cnn")
        row["aggregate"]["test"]["macro_f1"]["mean"] = mean
        run.mkdir(parents=True)
        (run / "results.json").write_text(json.dumps(row), "utf-8")
    lines = _report_lines(*runs)
    assert "result folder" in next(ln for ln in lines if "system" in ln)
    rows = [ln for ln in lines if "albert-pretrained(enc)+cnn" in ln]
    assert len(rows) == 2
    assert "seed1/enc/ft" in rows[0] and "41.00" in rows[0]
    assert "seed2/enc/ft" in rows[1] and "57.00" in rows[1]
    # the folder above them both finds the same two rows, named alike
    assert [ln for ln in _report_lines(tmp_path) if "albert-pretrained" in ln] == rows


def test_report_of_distinct_systems_keeps_its_columns(tmp_path: Path) -> None:
    """The result folder is shown where rows look alike only: the common table is unchanged,
    and one result given twice is still one row."""
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(_row(f"sys-{name}")), "utf-8")
    lines = _report_lines(tmp_path / "a", tmp_path / "b", tmp_path / "a" / "results.json")
    assert "result folder" not in "\n".join(lines)
    assert len([ln for ln in lines if "sys-" in ln]) == 2


def test_compare_still_refuses_a_run_pooled_twice_or_copied(tmp_path: Path) -> None:
    """Rows in `finetune report` carry their folder; `finetune compare --pool` must still
    find one run given twice, or a copy of it elsewhere, as the same results (it compares
    rows), and pool two runs of one system from two folders."""
    a = _row("albert-pretrained(m)+cnn")
    b = _row("albert-pretrained(m)+cnn", seed_preds=3)
    for name, row in (("a", a), ("copy", a), ("b", b), ("other", _row("sys-b"))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(row), "utf-8")

    def compare(*pool: str) -> object:
        args = ["finetune", "compare", str(tmp_path / "a"), str(tmp_path / "other")]
        return CliRunner().invoke(app, [*args, *(f"--pool={tmp_path / p}" for p in pool)])

    for pool in ("a", "copy"):
        out = compare(pool)
        assert isinstance(out.exception, DataError), (pool, out.output)
        assert "given twice" in str(out.exception)
    out = compare("b")
    assert out.exit_code == 0, out.output
    assert "5 and 2 seeds" in out.output


def test_report_writes_its_table_to_stdout(tmp_path: Path) -> None:
    """The table is what `finetune report` makes: it went to stderr, so `finetune report runs/
    > table.txt` (or `| grep`) got nothing."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "results.json").write_text(json.dumps(_row("sys-a")), "utf-8")
    out = CliRunner().invoke(app, ["finetune", "report", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert "sys-a" in out.stdout and "sys-a" not in out.stderr


def test_report_shows_brackets_in_names_as_written(tmp_path: Path) -> None:
    """Rich read "[head=cnn]" in a model folder's name (a pipeline grid variant's) as markup
    and dropped it: the system read as another's."""
    row = _row("albert-pretrained(enc[head=cnn])+cnn")
    row["dataset"] = "mine[a]"
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "results.json").write_text(json.dumps(row), "utf-8")
    lines = _report_lines(tmp_path)
    assert any("mine[a]" in ln and "albert-pretrained(enc[head=cnn])+cnn" in ln for ln in lines)
