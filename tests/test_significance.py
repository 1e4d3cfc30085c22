"""Paired bootstrap over test items (`tibnlp finetune compare`, the result table's interval)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, f1_score
from typer.testing import CliRunner

from tibnlp.cli.main import app
from tibnlp.errors import DataError
from tibnlp.evaluation.report import summary_table
from tibnlp.evaluation.significance import (
    compare_rows,
    paired_bootstrap,
    pool_rows,
    resampled_scores,
)

LABELS = 4


def _data(n: int = 300, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    true = rng.integers(0, LABELS - 1, n)  # class 3 never occurs: it still counts in macro
    noisy = np.where(rng.random(n) < 0.6, true, rng.integers(0, LABELS, n))
    return true, noisy


@pytest.mark.parametrize("metric", ["macro_f1", "weighted_f1", "accuracy"])
def test_scores_equal_scikit_learns_on_every_resample(metric) -> None:
    true, pred = _data()
    index = np.random.default_rng(1).integers(0, len(true), size=(5, len(true)))
    got = resampled_scores(true, pred, index, LABELS, metric)
    for row, score in zip(index, got, strict=True):
        t, p = true[row], pred[row]
        if metric == "accuracy":
            want = accuracy_score(t, p)
        else:
            average = metric.split("_")[0]
            want = f1_score(t, p, labels=range(LABELS), average=average, zero_division=0)
        assert score == pytest.approx(want, abs=1e-12)


def test_identical_systems_differ_by_nothing_and_a_better_one_is_found() -> None:
    true, pred = _data()
    same = paired_bootstrap(true, [pred, pred], [pred], LABELS, resamples=300)
    assert same.diff == 0 and same.low == 0 and same.high == 0 and same.not_above == 1
    better = np.where(np.arange(len(true)) % 2 == 0, true, pred)  # half the errors fixed
    d = paired_bootstrap(true, [better], [pred, pred], LABELS, resamples=500)
    assert d.diff > 0 and 0 < d.low < d.diff < d.high and d.not_above == 0
    assert d.a == pytest.approx(f1_score(true, better, labels=range(LABELS), average="macro"))
    again = paired_bootstrap(true, [better], [pred, pred], LABELS, resamples=500)
    assert again == d  # the resampling is seeded


def test_small_differences_get_an_interval_across_zero() -> None:
    true, pred = _data(n=900)
    flipped = pred.copy()
    flipped[:6] = true[:6]  # a handful of items: not a difference this test set can resolve
    d = paired_bootstrap(true, [flipped], [pred], LABELS, resamples=1000)
    assert d.low <= 0 < d.high and d.diff > 0


def _row(system: str, true: np.ndarray, preds: list[np.ndarray], dataset="tncc-title") -> dict:
    from sklearn.metrics import f1_score as f1

    scores = [f1(true, p, labels=range(LABELS), average="macro", zero_division=0) for p in preds]
    std = float(np.std(scores, ddof=1)) if len(scores) > 1 else 0.0
    agg = {"mean": float(np.mean(scores)), "std": std}
    return {
        "system": system,
        "dataset": dataset,
        "seeds": [{"seed": i, "predictions": {"test": p.tolist()}} for i, p in enumerate(preds)],
        "aggregate": {s: {"macro_f1": agg, "weighted_f1": agg} for s in ("test", "validation")},
        "targets": {"test": true.tolist()},
        "labels": [f"c{i}" for i in range(LABELS)],
        "notes": {},
    }


def test_rows_from_other_items_or_without_predictions_are_refused() -> None:
    true, pred = _data()
    a = _row("albert-pretrained(m)+cnn", true, [pred])
    other = _row("albert-random(m)+cnn", true[::-1].copy(), [pred[::-1].copy()])
    with pytest.raises(DataError, match="not scored on the same test items"):
        compare_rows(a, other)
    old = {**a, "seeds": [{"seed": 1}]}  # a results.json written before predictions were kept
    with pytest.raises(DataError, match="no item-level test predictions"):
        compare_rows(old, a)
    with pytest.raises(DataError, match="unknown metric"):
        compare_rows(a, a, metric="f2")
    # a part the run never scored: naming the parts it has, not advising a rerun
    with pytest.raises(DataError, match=r"holds no 'advts' part \(it has: test\)") as err:
        compare_rows(a, a, part="advts")
    assert "--eval-also advts" in str(err.value.hint)


def test_summary_table_gives_the_gain_over_the_twin_an_interval() -> None:
    true, pred = _data()
    better = np.where(np.arange(len(true)) % 2 == 0, true, pred)
    rows = [
        _row("albert-pretrained(m)+cnn", true, [better]),
        _row("albert-random(m)+cnn", true, [pred]),
    ]
    line = next(ln for ln in summary_table(rows).splitlines() if "albert-pretrained" in ln)
    gain = line.rstrip(" |").split(" | ")[-1]
    d = compare_rows(rows[0], rows[1])
    assert gain == f"{100 * d.diff:+.2f} {d.interval()}" and d.low > 0
    old = [{**r, "targets": {}} for r in rows]  # old results: the point gain alone
    line = next(ln for ln in summary_table(old).splitlines() if "albert-pretrained" in ln)
    assert line.rstrip(" |").split(" | ")[-1] == f"{100 * d.diff:+.2f}"


def test_summary_table_compares_each_label_count_with_its_own_best_twin() -> None:
    """A few-label curve: rows fine-tuned on 371 and on all 7,422 titles each meet the twin of
    their own size; of two twin recipes at one size the gain is over the better on validation."""
    true, pred = _data()
    better = np.where(np.arange(len(true)) % 2 == 0, true, pred)
    worse = np.where(np.arange(len(true)) % 3 == 0, (true + 1) % LABELS, pred)

    def sized(row: dict, train: int, val: float | None = None) -> dict:
        if val is not None:  # a validation score of its own (selection reads it)
            row["aggregate"]["validation"] = {"macro_f1": {"mean": val, "std": 0.0}}
        return {**row, "notes": {"sizes": {"train": train, "validation": 927, "test": 927}}}

    rows = [
        sized(_row("albert-pretrained(m)+cnn", true, [better]), 371),
        sized(_row("albert-random(m)+cnn", true, [pred]), 371, val=0.40),  # chosen
        sized(_row("albert-random(m)+cnn", true, [worse]), 371, val=0.30),
        sized(_row("albert-pretrained(m)+cnn", true, [pred]), 7422),
        sized(_row("albert-random(m)+cnn", true, [better]), 7422),
    ]
    table = summary_table(rows).splitlines()
    assert "| labelled examples |" in table[2]
    pretrained = [ln.split(" | ") for ln in table if "albert-pretrained" in ln]
    assert [cells[1] for cells in pretrained] == ["371", "7,422"]
    gains = [cells[-1].rstrip(" |") for cells in pretrained]
    assert gains[0] == f"{100 * compare_rows(rows[0], rows[1]).diff:+.2f} " + (
        compare_rows(rows[0], rows[1]).interval()
    )
    assert gains[1].startswith(f"{100 * compare_rows(rows[3], rows[4]).diff:+.2f}")
    assert compare_rows(rows[3], rows[4]).diff < 0 < compare_rows(rows[0], rows[1]).diff
    marked = [ln for ln in table if "best on validation" in ln]
    assert len(marked) == 1 and "| 371 |" in marked[0] and "| 40.00 |" in marked[0]
    # one size throughout: no such column (the main job's table as it was)
    assert "labelled" not in summary_table(rows[3:]).splitlines()[2]


def test_compare_command(tmp_path) -> None:
    true, pred = _data()
    better = np.where(np.arange(len(true)) % 2 == 0, true, pred)
    for name, row in (
        ("a", _row("sys-a", true, [better, better])),
        ("b", _row("sys-b", true, [pred])),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(row), "utf-8")
    runner = CliRunner()
    out = runner.invoke(app, ["finetune", "compare", str(tmp_path / "a"), str(tmp_path / "b")])
    assert out.exit_code == 0, out.output
    assert "over 300 items, 2 and 1 seeds" in out.output and "A - B: +" in out.output
    assert "95% interval [+" in out.output
    both = runner.invoke(app, ["finetune", "compare", str(tmp_path), str(tmp_path / "b")])
    assert isinstance(both.exception, DataError) and "holds 2 results" in str(both.exception)


def test_runs_of_one_system_pool_their_seeds(tmp_path) -> None:
    true, pred = _data()
    better = np.where(np.arange(len(true)) % 2 == 0, true, pred)
    rows = {
        "s1": _row("sys-a", true, [better]),
        "s2": _row("sys-a", true, [pred, better]),
        "b": _row("sys-b", true, [pred]),
        "other": _row("sys-c", true, [pred]),
    }
    for name, row in rows.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(row), "utf-8")
    pooled = pool_rows([rows["s1"], rows["s2"]])
    assert len(pooled["seeds"]) == 3
    want = paired_bootstrap(true, [better, pred, better], [pred], LABELS)
    assert compare_rows(pooled, rows["b"]) == want
    args = ["finetune", "compare", str(tmp_path / "s1"), str(tmp_path / "b")]
    out = CliRunner().invoke(app, [*args, "--pool", str(tmp_path / "s2")])
    assert out.exit_code == 0, out.output
    assert "3 and 1 seeds" in out.output and f"A - B: {100 * want.diff:+.2f}" in out.output
    with pytest.raises(DataError, match="cannot be pooled"):
        pool_rows([rows["s1"], rows["other"]])
    # B among A's runs: its own seeds would count for A (A - B drawn towards zero)
    typo = CliRunner().invoke(app, [*args, "--part", "tset"])  # through pool_rows, as run
    assert "holds no 'tset' part (it has: test)" in str(typo.exception)
    twice = CliRunner().invoke(app, [*args, "--pool", str(tmp_path / "s2"), "--pool", args[3]])
    assert twice.exit_code != 0 and "system B is also among A's runs" in str(twice.exception)
    with pytest.raises(DataError, match="system B is also among A's runs"):
        pool_rows([rows["s1"], rows["s2"]], against=rows["s2"])
    # a copy of B's folder in A's pool is the same run: the message says why it is refused
    (tmp_path / "b-copy").mkdir()
    (tmp_path / "b-copy" / "results.json").write_text(json.dumps(rows["b"]), "utf-8")
    copied = CliRunner().invoke(app, [*args, "--pool", str(tmp_path / "b-copy")])
    assert copied.exit_code != 0 and "the same folder, a copy" in str(copied.exception)
    # more runs of B (its other fine-tuning seeds) pool on B's side the same way
    (tmp_path / "b2").mkdir()
    (tmp_path / "b2" / "results.json").write_text(json.dumps(_row("sys-b", true, [better])))
    both_pooled = [*args, "--pool", str(tmp_path / "s2"), "--pool-b", str(tmp_path / "b2")]
    out = CliRunner().invoke(app, both_pooled)
    want = paired_bootstrap(true, [better, pred, better], [pred, better], LABELS)
    assert out.exit_code == 0, out.output
    assert "3 and 2 seeds" in out.output and f"A - B: {100 * want.diff:+.2f}" in out.output
    crossed = CliRunner().invoke(app, [*args, "--pool-b", str(tmp_path / "s1")])
    assert crossed.exit_code != 0 and "system B is also among A's runs" in str(crossed.exception)
    # another pretraining seed's model folder has another name: the same recipe still pools
    seed2 = _row("albert-pretrained(seed2)+cnn@0,-1", true, [pred])
    seed3 = _row("albert-pretrained(wide-model)+cnn@0,-1", true, [better])
    assert len(pool_rows([seed3, seed2])["seeds"]) == 2
    with pytest.raises(DataError, match="cannot be pooled"):
        pool_rows([seed3, _row("albert-random(wide-model)+cnn@0,-1", true, [pred])])
    with pytest.raises(DataError, match="cannot be pooled"):
        pool_rows([seed3, _row("albert-pretrained(seed2)+cnn", true, [pred])])
    with pytest.raises(DataError, match="cannot be pooled"):  # the parentheses name the system
        pool_rows(
            [
                _row("textcnn-pieces(scratch)", true, [pred]),
                _row("textcnn-pieces(pretrained)", true, [pred]),
            ]
        )


def test_pooling_checks_the_items_of_the_part_compared() -> None:
    """Runs whose test_unseen items differ (scored before and after test_unseen counted the
    titles actually trained on) still pool on test, and only there."""
    true, pred = _data()
    old = _row("albert-pretrained(a)+cnn", true, [pred])
    new = _row("albert-pretrained(b)+cnn", true, [pred])
    old["targets"]["test_unseen"], new["targets"]["test_unseen"] = [0, 1], [0, 1, 2]
    pooled = pool_rows([old, new], "test")
    assert len(pooled["seeds"]) == 2 and pooled["targets"] == {"test": true.tolist()}
    with pytest.raises(DataError, match=r"cannot be pooled .* on test_unseen"):
        pool_rows([old, new], "test_unseen")
    with pytest.raises(DataError, match="cannot be pooled"):
        pool_rows([old, new])


def test_a_run_pooled_twice_is_refused() -> None:
    """`--pool` naming A's own folder (or one run twice) counted its seeds twice: the pooled
    mean then weights that run double while the output claims more seeds."""
    true, pred = _data()
    s1 = _row("sys-a", true, [pred])
    s2 = _row("sys-a", true, [np.where(np.arange(len(true)) % 2 == 0, true, pred)])
    with pytest.raises(DataError, match="given twice"):
        pool_rows([s1, s2, json.loads(json.dumps(s1))])
    assert len(pool_rows([s1, s2])["seeds"]) == 2


def test_summary_table_says_when_the_twin_was_scored_on_other_items() -> None:
    """The point gain without an interval is for results written before predictions were
    kept; a twin scored on other test items (another version of the data) fell back to it
    silently, as if the two rows were comparable."""
    true, pred = _data()
    better = np.where(np.arange(len(true)) % 2 == 0, true, pred)
    rows = [
        _row("albert-pretrained(m)+cnn", true, [better]),
        _row("albert-random(m)+cnn", true[::-1].copy(), [pred[::-1].copy()]),
    ]
    line = next(ln for ln in summary_table(rows).splitlines() if "albert-pretrained" in ln)
    assert "not the same test items" in line.rstrip(" |").split(" | ")[-1]


def test_the_pipeline_table_names_the_run_of_rows_that_look_alike(tmp_path) -> None:
    """The variants of a grid (finetune[lr=...]) gave rows of one system, sorted: nothing said
    which row was which recipe. They now carry their stage run, in a column shown only then."""
    from tibnlp.pipeline.runner import PipelineRun, _finetune_table

    true, pred = _data()
    better = np.where(np.arange(len(true)) % 2 == 0, true, pred)
    run = PipelineRun([])
    made = {
        "finetune[lr=0.0005]": _row("albert-pretrained(m)+cnn", true, [pred]),
        "finetune[lr=0.002]": _row("albert-pretrained(m)+cnn", true, [better]),
        "ft2": _row("albert-random(m)+cnn", true, [pred]),
    }
    for name, row in made.items():
        out = tmp_path / name
        out.mkdir()
        (out / "results.json").write_text(json.dumps(row), encoding="utf-8")
        run.outputs[name] = out
        run.results[name] = {"system": row["system"], "dataset": "d", "test_macro_f1": 0.1}
    table = _finetune_table(run)[0].splitlines()
    assert "| system | pipeline run | pretraining tokens |" in table[2]
    cells = {ln.split(" | ")[2]: ln.split(" | ")[-1] for ln in table if "albert-pre" in ln}
    assert set(cells) == {"finetune[lr=0.0005]", "finetune[lr=0.002]"}
    assert cells["finetune[lr=0.002]"].startswith("+")  # its own gain, not the other's
    del run.outputs["finetune[lr=0.0005]"], run.results["finetune[lr=0.0005]"]
    assert "pipeline run" not in _finetune_table(run)[0]  # no two alike: no column
