"""`tibnlp runs compare`: runs grouped by model configuration, mean and std over seeds."""

from __future__ import annotations

import csv
import io
import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tibnlp.cli.main import app
from tibnlp.tracking import Tracker
from tibnlp.tracking.compare import Cell, Comparison
from tibnlp.tracking.testing import sqlite_store

SCORES = {  # (model, small, large, head) -> macro F1 per seed
    ("fixed8", 8, 8, "cnn"): [0.60, 0.62, 0.64],
    ("fixed8", 8, 8, "linear"): [0.55, 0.57, 0.53],
    ("dma6-12", 6, 12, "cnn"): [0.66, 0.65, 0.67],
    ("dma6-12", 6, 12, "linear"): [0.58, 0.60, 0.59],
}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("compare")
    uri = sqlite_store(folder)
    with Tracker("dma", "pipeline", uri=uri, buffer_dir=folder / "buf") as parent:
        pre = parent.child("pretrain[fixed8]", tags={"tibnlp.model": "fixed8"})
        pre.log_metrics({"loss": 3.0}, step=10)  # no test metric: not in the table
        pre.end()
        for (model, small, large, head), seeds in SCORES.items():
            stage = parent.child(f"finetune[{model},{head}]", tags={"tibnlp.model": model})
            stage.log_params({"finetune": {"head": head}})
            mean = sum(seeds) / len(seeds)  # the stage's aggregate: not counted again
            stage.log_metrics({"test_macro_f1": mean, "test_weighted_f1": mean + 0.05})
            stage.log_metrics({"test_macro_f1_std": 0.01})  # the stage's own aggregate column
            for seed, f1 in enumerate(seeds, start=1):
                run = stage.child(f"seed {seed}", tags={"tibnlp.model": model})
                run.log_params(
                    {
                        "model": {"heads": {"small": small, "large": large}},
                        "finetune": {"head": head, "seed": seed, "task": "title"},
                    }
                )
                run.log_metrics({"test_macro_f1": f1, "test_weighted_f1": f1 + 0.05}, step=0)
                run.log_metrics({"test_macro_precision": f1}, step=0)  # not a headline column
                run.log_metrics({"val_f1_macro": f1 - 0.01}, step=1)
                run.end()
            stage.end()
        failed = parent.child("finetune[broken]", tags={"tibnlp.model": "fixed8"})
        failed.log_metrics({"test_macro_f1": 0.0})
        failed.end("FAILED")  # failed runs stay out of the table
    return uri


def _invoke(*args: str) -> str:
    """The table, in each form on stdout (what is said beside it, on stderr, is checked
    apart). The rich table went to stderr: `runs compare ... > table.txt` got nothing."""
    result = CliRunner().invoke(app, ["runs", "compare", *args])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_a_failed_run_left_out_is_said(store: str) -> None:
    """A failed, killed or running seed was left out of the means without a word: the row
    read as fewer seeds, or the experiment as done."""
    args = ["runs", "compare", "-e", "dma", "-f", "csv", "--tracking-uri", store]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "not finished (1 FAILED)" in result.stderr
    assert "FAILED" not in result.stdout  # the csv stays machine-readable


def test_markdown_groups_by_model_and_head(store: str) -> None:
    out = _invoke("--experiment", "dma", "--format", "markdown", "--tracking-uri", store)
    lines = out.strip().splitlines()
    assert lines[0].split("|")[1:-1] == [
        " tibnlp.model ",
        " model.heads.small ",
        " model.heads.large ",
        " finetune.head ",
        " runs ",
        " test_macro_f1 ",
        " test_weighted_f1 ",
    ]
    rows = [[c.strip() for c in ln.split("|")[1:-1]] for ln in lines[2:]]
    assert [r[:4] for r in rows] == [  # the order the runs were made in (a pipeline's order)
        ["fixed8", "8", "8", "cnn"],
        ["fixed8", "8", "8", "linear"],
        ["dma6-12", "6", "12", "cnn"],
        ["dma6-12", "6", "12", "linear"],
    ]
    seeds = SCORES[("fixed8", 8, 8, "cnn")]
    mean, std = statistics.mean(seeds), statistics.stdev(seeds)
    assert rows[0][4] == "3"
    assert rows[0][5] == f"{mean:.4f} ± {std:.4f}"
    # neither an aggregate run's `*_std` nor non-headline metrics become (empty) columns
    assert "_std" not in lines[0] and "precision" not in lines[0]


def test_markdown_escapes_pipes_and_line_breaks_in_group_values() -> None:
    """A tag value with a `|` or a line break (a model's name, a grid variant) stays in its
    cell: the row keeps its columns."""
    rows = [(["enc|v2\\", "a\nb"], 2, [Cell([0.6, 0.6])])]
    table = Comparison(["tag:tibnlp.model", "finetune.head"], ["test_macro_f1"], rows)
    assert table.markdown().splitlines()[2] == "| enc\\|v2\\\\ | a b | 2 | 0.6000 ± 0.0000 |"


def test_csv_pivot_puts_heads_side_by_side(store: str) -> None:
    out = _invoke(
        "-e",
        "dma",
        "-f",
        "csv",
        "--metric",
        "test_macro_f1",
        "--columns-by",
        "finetune.head",
        "--tracking-uri",
        store,
    )
    rows = list(csv.reader(io.StringIO(out)))
    assert rows[0] == [
        "tibnlp.model",
        "model.heads.small",
        "model.heads.large",
        "runs min",
        "runs max",
        "warning",
        "test_macro_f1 [cnn] mean",
        "test_macro_f1 [cnn] std",
        "test_macro_f1 [linear] mean",
        "test_macro_f1 [linear] std",
    ]
    dma = rows[2]  # after fixed8, made first
    assert dma[0] == "dma6-12"
    assert float(dma[6]) == pytest.approx(statistics.mean(SCORES[("dma6-12", 6, 12, "cnn")]))
    assert float(dma[9]) == pytest.approx(statistics.stdev(SCORES[("dma6-12", 6, 12, "linear")]))


def test_aggregate_runs_add_no_empty_columns(store: str) -> None:
    out = _invoke("-e", "dma", "-f", "csv", "-m", "test*", "--tracking-uri", store)
    header = next(csv.reader(io.StringIO(out)))
    assert "test_macro_precision mean" in header
    assert not [h for h in header if "_std" in h.split()[0]]  # the stage's own aggregates


def test_glob_metrics_and_table_format(store: str) -> None:
    out = _invoke("-e", "dma", "-m", "val_*", "-g", "tag:tibnlp.model", "--tracking-uri", store)
    assert "val_f1_macro" in out and "fixed8" in out and "test_macro_f1" not in out
    only = _invoke(
        "-e",
        "dma",
        "-f",
        "csv",
        "--filter",
        "params.finetune.head = 'cnn'",
        "--tracking-uri",
        store,
    )
    assert "linear" not in only and only.count("\n") == 3  # header + two models


def test_unknown_experiment_is_a_clear_error(store: str, tmp_path: Path) -> None:
    from tibnlp.errors import TibnlpError
    from tibnlp.tracking.compare import compare_runs

    with pytest.raises(TibnlpError, match="no experiment named 'nope'"):
        compare_runs("nope", uri=store)
    with pytest.raises(TibnlpError, match="no finished run"):
        compare_runs("dma", ["bleu*"], uri=store)


def test_natural_order_and_percent(store: str) -> None:
    out = _invoke(
        "-e",
        "dma",
        "-f",
        "markdown",
        "--order",
        "natural",
        "--percent",
        "--digits",
        "2",
        "--tracking-uri",
        store,
    )
    rows = [[c.strip() for c in ln.split("|")[1:-1]] for ln in out.strip().splitlines()[2:]]
    assert [r[0] for r in rows] == ["dma6-12", "dma6-12", "fixed8", "fixed8"]
    seeds = [100 * v for v in SCORES[("dma6-12", 6, 12, "cnn")]]
    assert rows[0][5] == f"{statistics.mean(seeds):.2f} ± {statistics.stdev(seeds):.2f}"


def test_runs_column_shows_the_range_when_cells_count_differently(tmp_path: Path) -> None:
    """Under --columns-by each cell has its own runs: the CNN head three seeds, the linear one
    seed. The runs column showed the largest count (3) beside a linear mean of one run."""
    from tibnlp.tracking.compare import compare_runs

    uri = sqlite_store(tmp_path)
    with Tracker("uneven", "p", uri=uri, buffer_dir=tmp_path / "buf") as parent:
        for head, seeds in (("cnn", [0.6, 0.62, 0.64]), ("linear", [0.5])):
            for seed, f1 in enumerate(seeds, start=1):
                with parent.child(f"{head} {seed}", tags={"tibnlp.model": "m"}) as run:
                    run.log_params({"finetune": {"head": head, "seed": seed}})
                    run.log_metrics({"test_macro_f1": f1})
    result = compare_runs("uneven", ["test_macro_f1"], columns_by="finetune.head", uri=uri)
    assert [[c.text() for c in cells] for _, _, cells in result.rows] == [
        ["0.6200 ± 0.0200", "0.5000"]
    ]
    ((runs, *_),) = [row[len(result.group_keys) :] for row in result.table()]
    assert runs == "1–3"
    (csv_row,) = csv.DictReader(io.StringIO(result.csv()))
    assert (csv_row["runs min"], csv_row["runs max"], csv_row["warning"]) == ("1", "3", "")
    # every cell from as many runs: the count itself
    even = compare_runs(
        "uneven", ["test_macro_f1"], uri=uri, filter_string="params.finetune.head = 'cnn'"
    )
    assert [row[len(even.group_keys)] for row in even.table()] == ["3"]


def test_seeds_stuck_at_the_majority_class_are_marked(tmp_path: Path) -> None:
    """A seed fine-tuning tags `warning=majority_class` when it predicts (nearly) one class:
    its score is not a result. The mean over seeds still holds it, so the row must say so,
    as `finetune report` does, instead of reading like three honest seeds."""
    from tibnlp.tracking.compare import compare_runs

    uri = sqlite_store(tmp_path)
    with Tracker("stuck", "p", uri=uri, buffer_dir=tmp_path / "buf") as parent:
        for model, scores in (("ok", [0.6, 0.62, 0.64]), ("bad", [0.6, 0.03, 0.62])):
            for seed, f1 in enumerate(scores, start=1):
                with parent.child(f"{model} {seed}", tags={"tibnlp.model": model}) as run:
                    run.log_metrics({"test_macro_f1": f1})
                    if f1 < 0.1:
                        run.set_tags({"warning": "majority_class"})
    result = compare_runs("stuck", ["test_macro_f1"], uri=uri)
    runs = {row[0]: row[1] for row in result.table()}
    assert runs == {"ok": "3", "bad": "3 (1 at majority class: not a result)"}
    assert "3 (1 at majority class" in result.markdown()
    csv_rows = {r["tibnlp.model"]: r for r in csv.DictReader(io.StringIO(result.csv()))}
    assert csv_rows["bad"]["runs max"] == "3"
    assert csv_rows["bad"]["warning"] == "1 at majority class: not a result"
    assert csv_rows["ok"]["warning"] == ""
    # under --columns-by the mark names the column whose runs it counts; pivoting on the
    # only key that varies leaves one row (grouping by the pivot too made a diagonal table)
    pivoted = compare_runs("stuck", ["test_macro_f1"], columns_by="tag:tibnlp.model", uri=uri)
    assert pivoted.group_keys == [] and len(pivoted.rows) == 1
    assert pivoted.runs(0) == "3 (1 [bad] at majority class: not a result)"


def test_runs_of_other_datasets_systems_or_settings_are_not_taken_for_seeds(
    tmp_path: Path,
) -> None:
    """`tibnlp finetune` runs carry no `tibnlp.model` tag (pipelines set it): runs of two
    datasets, of two pretrained models or with two learning rates, in one experiment (the
    default one), were one row of "4 runs" whose mean belonged to no system."""
    from tibnlp.tracking.compare import compare_runs

    uri = sqlite_store(tmp_path)
    runs = [  # dataset, system, model, lr, seed list, output, seed, score
        ("tncc-title", "textcnn", "", 0.01, "[1, 2]", "runs/a", 1, 0.9),
        ("tncc-title", "textcnn", "", 0.01, "[3]", "runs/b", 3, 0.92),  # more seeds, later
        ("myset", "textcnn", "", 0.01, "[1]", "runs/a", 1, 0.6),
        ("tncc-title", "albert(mlmA)", "mlmA", 0.01, "[1]", "runs/a", 1, 0.7),
        ("tncc-title", "albert(mlmB)", "mlmB", 0.01, "[1]", "runs/a", 1, 0.5),
        ("tncc-title", "textcnn", "", 0.5, "[1]", "runs/a", 1, 0.2),
        # two pipelines' models: the system names a model by its folder's last name
        ("tncc-title", "albert(model)", "work/a/model", 0.01, "[1]", "runs/a", 1, 0.66),
        ("tncc-title", "albert(model)", "work/b/model", 0.01, "[1]", "runs/a", 1, 0.56),
    ]
    for dataset, system, model, lr, seeds, output, seed, f1 in runs:  # a `tibnlp finetune` each
        tags = {"dataset": dataset, "system": system}
        with (
            Tracker("tibnlp", system, uri=uri, buffer_dir=tmp_path / "buf", tags=tags) as parent,
            parent.child(f"seed {seed}", tags={**tags, "seed": str(seed)}) as run,
        ):
            run.log_params(
                {
                    "finetune": {
                        "model": model,
                        "optimizer": {"lr": lr},
                        "seeds": seeds,
                        "output": output,
                        "seed": seed,
                    }
                }
            )
            run.log_metrics({"test_macro_f1": f1})
    with (  # a run of an older version, without a setting added since: not split off
        Tracker("tibnlp", "old", uri=uri, buffer_dir=tmp_path / "buf", tags=tags) as parent,
        parent.child("seed 4", tags={"dataset": "myset", "system": "textcnn"}) as run,
    ):
        run.log_params({"finetune": {"model": "", "seeds": "[4]", "output": "/x/a", "seed": 4}})
        run.log_metrics({"test_macro_f1": 0.62})
    result = compare_runs("tibnlp", ["test_macro_f1"], uri=uri)
    keys = ["tag:dataset", "tag:system", "finetune.model", "finetune.optimizer.lr"]
    assert result.group_keys == keys
    rows = {tuple(g): (n, cells[0].text(2)) for g, n, cells in result.rows}
    assert rows == {
        ("tncc-title", "textcnn", "", "0.01"): (2, "0.91 ± 0.01"),  # repeats: seeds 1 and 3
        ("myset", "textcnn", "", "0.01"): (2, "0.61 ± 0.01"),  # with the older run's seed 4
        ("tncc-title", "albert(mlmA)", "mlmA", "0.01"): (1, "0.70"),
        ("tncc-title", "albert(mlmB)", "mlmB", "0.01"): (1, "0.50"),
        ("tncc-title", "textcnn", "", "0.5"): (1, "0.20"),
        ("tncc-title", "albert(model)", "work/a/model", "0.01"): (1, "0.66"),
        ("tncc-title", "albert(model)", "work/b/model", "0.01"): (1, "0.56"),
    }


def test_an_infinite_metric_is_shown_as_such(tmp_path: Path) -> None:
    """MLflow stores inf (a diverged loss) as the largest float: the spread raised
    OverflowError (a traceback from `runs compare` and `runs plot`), and a mean would have
    printed 309 digits."""
    from tibnlp.tracking.compare import compare_runs

    uri = sqlite_store(tmp_path)
    with Tracker("inf", "p", uri=uri, buffer_dir=tmp_path / "buf") as parent:
        for seed, loss in ((1, float("inf")), (2, 0.5)):
            with parent.child(f"seed {seed}") as run:
                run.log_metrics({"test_macro_f1": 0.5, "train_loss": loss})
    result = compare_runs("inf", ["test_macro_f1", "train_loss"], uri=uri)
    assert [c.text() for c in result.rows[0][2]] == ["0.5000 ± 0.0000", "inf ± nan"]


def test_a_metric_not_known_is_left_out_of_its_mean(tmp_path: Path) -> None:
    """A shad flip rate is NaN where no test text was read with its shad: `runs compare`
    showed "nan ± nan" for the seeds together; it is left out, as the results' means do."""
    from tibnlp.tracking.compare import compare_runs

    uri = sqlite_store(tmp_path)
    with Tracker("nan", "p", uri=uri, buffer_dir=tmp_path / "buf") as parent:
        for seed, rate in ((1, float("nan")), (2, 0.25), (3, 0.75)):
            with parent.child(f"seed {seed}") as run:
                run.log_metrics({"test_macro_f1": 0.5, "test_shad_flip_rate": rate})
    result = compare_runs("nan", ["test_macro_f1", "test_shad_flip_rate"], uri=uri)
    assert [c.text() for c in result.rows[0][2]] == ["0.5000 ± 0.0000", "0.5000 ± 0.3536"]
