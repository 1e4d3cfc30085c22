"""`tibnlp runs plot`: the learning curve drawn from a store with several experiments (built
here with the tracker; no training), logged to the parent run, and a clear failure on an
experiment without the metric."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from tibnlp.cli.main import app
from tibnlp.errors import TibnlpError
from tibnlp.evaluation.curve import aggregate_curve
from tibnlp.tracking import Tracker
from tibnlp.tracking.curve import pipeline_parent, read_curve_runs
from tibnlp.tracking.testing import sqlite_store

# (system, init, encoder, tokens, seconds) -> test macro-F1 per seed
SYSTEMS = {
    ("tokens-1000", "pretrained", "albert", 1000, 36.0): [0.40, 0.42, 0.44],
    ("tokens-4000", "pretrained", "albert", 4000, 144.0): [0.50, 0.52, 0.54],
    ("random", "random", "albert", 0, 0.0): [0.35, 0.36, 0.37],
    ("textcnn", "random", "none", 0, 0.0): [0.55, 0.56, 0.57],
}


def _experiment(
    uri: str, folder: Path, name: str, pipeline: bool, dataset: str = "tncc-title"
) -> str:
    tags = {"tibnlp.pipeline": "curve"} if pipeline else {}
    with Tracker(name, "curve", uri=uri, buffer_dir=folder / "buf", tags=tags) as parent:
        for (system, init, encoder, tokens, seconds), scores in SYSTEMS.items():
            with parent.child(f"finetune[{system}]") as stage:
                stage.log_metrics({"test_macro_f1": sum(scores) / 3})  # the aggregate: not a seed
                for seed, f1 in enumerate(scores, start=1):
                    with stage.child(f"seed {seed}", tags={"dataset": dataset}) as run:
                        run.log_params(
                            {
                                "finetune": {"init": init, "encoder": encoder, "head": "cnn"},
                                "finetune.model": "/m" if encoder == "albert" else "",
                                "pretrain.tokens": tokens,
                                "pretrain.train_seconds": seconds,
                                "pretrain.processes": 2,
                            }
                        )
                        run.log_metrics({"test_macro_f1": f1, "validation_macro_f1": f1 + 0.01})
    return str(parent.run_id)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    folder = tmp_path_factory.mktemp("plot")
    uri = sqlite_store(folder)
    parent = _experiment(uri, folder, "curve-a", pipeline=True)
    _experiment(uri, folder, "curve-b", pipeline=False)
    _experiment(uri, folder, "curve-mixed", pipeline=False)
    _experiment(uri, folder, "curve-mixed", pipeline=False, dataset="tusa")
    with Tracker("no-metric", "pretrain", uri=uri, buffer_dir=folder / "buf") as run:
        run.log_metrics({"loss": 3.0, "test_accuracy": 0.5})
    return uri, parent


def test_reads_seed_runs_with_their_pretraining(store: tuple[str, str]) -> None:
    uri, _ = store
    read = read_curve_runs(["curve-a"], uri=uri)
    assert len(read.runs) == 12  # the seeds, not the stages' aggregates
    assert len(read_curve_runs(["curve-a", "curve-a"], uri=uri).runs) == 12  # named twice
    curve = aggregate_curve(read.runs, "macro_f1", ["test", "validation"])
    pretrained = curve.of("pretrained")
    assert [p.tokens for p in pretrained] == [1000, 4000]
    assert pretrained[1].values["test"].mean == pytest.approx(0.52)
    assert pretrained[1].values["test"].std == pytest.approx(0.02)
    assert pretrained[1].hours == pytest.approx(144.0 * 2 / 3600)  # seconds x processes
    assert [p.values["test"].mean for p in curve.of("random")] == [pytest.approx(0.36)]
    assert [p.values["test"].mean for p in curve.of("textcnn")] == [pytest.approx(0.56)]
    assert curve.dataset == "tncc-title"


def test_plot_from_several_experiments_logs_to_the_pipeline_run(
    store: tuple[str, str], tmp_path: Path
) -> None:
    uri, parent = store
    out = tmp_path / "figs" / "curve.png"
    args = ["runs", "plot", "-e", "curve-a", "-e", "curve-b", "-o", str(out)]
    result = CliRunner().invoke(app, [*args, "--tracking-uri", uri])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.parent.glob(".*"))  # written atomically: no temporary left
    assert pipeline_parent("curve-a", uri) == parent
    client = MlflowClient(uri)
    assert "curve.png" in [a.path for a in client.list_artifacts(parent)]
    assert client.get_run(parent).info.status == "FINISHED"  # logged to, left as it was


def test_plot_to_a_given_run(store: tuple[str, str], tmp_path: Path) -> None:
    uri, _ = store
    client = MlflowClient(uri)
    target = client.search_runs([client.get_experiment_by_name("curve-b").experiment_id])[0]
    out = tmp_path / "b.png"
    args = ["runs", "plot", "-e", "curve-b", "-o", str(out), "--run-id", target.info.run_id]
    result = CliRunner().invoke(app, [*args, "--tracking-uri", uri, "--part", "test"])
    assert result.exit_code == 0, result.output
    assert "b.png" in [a.path for a in client.list_artifacts(target.info.run_id)]


def test_fails_clearly_on_an_experiment_without_the_metric(
    store: tuple[str, str], tmp_path: Path
) -> None:
    uri, _ = store
    out = tmp_path / "x.png"
    args = ["runs", "plot", "-e", "curve-a", "-e", "no-metric", "-o", str(out)]
    result = CliRunner().invoke(app, [*args, "--tracking-uri", uri])
    # `tibnlp` prints a TibnlpError's message and hint and exits with its code (2)
    assert isinstance(result.exception, TibnlpError) and result.exception.exit_code == 2
    message = str(result.exception)
    assert "'no-metric'" in message and "'test_macro_f1'" in message
    assert "test_accuracy" in message  # what the experiment does have
    assert not out.exists()
    args = ["runs", "plot", "-e", "curve-a", "-o", str(out), "--metric", "micro_f1"]
    result = CliRunner().invoke(app, [*args, "--tracking-uri", uri])
    assert isinstance(result.exception, TibnlpError)
    assert "'curve-a'" in str(result.exception) and "'test_micro_f1'" in str(result.exception)


def _drawn(
    runs: list, axis: str = "tokens", parts: tuple[str, ...] = ("test",)
) -> tuple[list[str], list]:
    """The labels and the lines of one panel of the curve of `runs`."""
    from tibnlp.evaluation.curve import _panel
    from tibnlp.evaluation.plots import plt

    fig, ax = plt.subplots()
    try:
        _panel(ax, aggregate_curve(runs, "macro_f1", list(parts)), axis, labelled=False)
        return ax.get_legend_handles_labels()[1], list(ax.get_lines())
    finally:
        plt.close(fig)


def test_a_reference_line_with_seeds_at_the_majority_class_says_so() -> None:
    """A random-init twin stuck at the majority class is no 0-token reference: its line must
    be marked as the curve's points are, or the gain over it reads as pretraining's."""
    from tibnlp.evaluation.curve import CurveRun

    def run(kind: str, tokens: float, f1: float, warning: str = "") -> CurveRun:
        return CurveRun(kind, tokens, 1.0 if tokens else 0.0, {"test": f1}, warning=warning)

    runs = [run("pretrained", 1000, f) for f in (0.5, 0.52)]
    runs += [run("random", 0, 0.45), run("random", 0, 0.04, "majority_class")]
    runs += [run("random", 0, 0.46)]
    labels, _ = _drawn(runs)
    (twin,) = [label for label in labels if label.startswith("random-init")]
    assert "NOT LEARNING: 1/3 seeds at majority class" in twin
    labels, _ = _drawn([r for r in runs if not r.warning])
    assert not [label for label in labels if "NOT LEARNING" in label]


def test_the_hours_panel_draws_its_line_in_the_order_of_its_axis() -> None:
    """Points come sorted by tokens; where CPU-hours do not grow with tokens (exports of runs
    on other thread counts in one series) the hours line went back and forth."""
    from tibnlp.evaluation.curve import CurveRun

    runs = [
        CurveRun("pretrained", tokens, hours, {"test": f1})
        for tokens, hours, f1 in ((1000, 2.0, 0.5), (4000, 1.0, 0.6), (8000, 3.0, 0.7))
    ]
    _, lines = _drawn(runs, "hours")
    curve = next(line for line in lines if len(line.get_xdata()) == 3)
    assert list(curve.get_xdata()) == [1.0, 2.0, 3.0]
    assert list(curve.get_ydata()) == pytest.approx([60.0, 50.0, 70.0])


def test_textcnn_on_a_pretrained_embedding_is_not_the_from_scratch_reference(
    tmp_path: Path,
) -> None:
    """`finetune.encoder=none` with a pretrained model is TextCNN on that model's word
    embedding (the quickstart's `vectors` stage): a pretrained system at that model's tokens,
    a curve of its own; it was drawn as (and averaged into) the from-scratch TextCNN line."""
    from tibnlp.tracking.curve import run_kind

    uri = sqlite_store(tmp_path)
    systems = (  # (init, encoder, model, tokens) -> test macro-F1 per seed
        (("pretrained", "albert", "/m", 1000), [0.50, 0.52]),
        (("pretrained", "none", "/m", 1000), [0.60, 0.62]),
        (("random", "none", "", 0), [0.40, 0.42]),
    )
    with Tracker("vectors", "p", uri=uri, buffer_dir=tmp_path / "buf") as parent:
        for (init, encoder, model, tokens), scores in systems:
            for seed, f1 in enumerate(scores, start=1):
                with parent.child(f"{encoder} {init} {seed}") as run:
                    run.log_params(
                        {
                            "finetune": {"init": init, "encoder": encoder, "head": "cnn"},
                            "finetune.model": model,
                            "pretrain.tokens": tokens,
                            "pretrain.train_seconds": 36.0 if tokens else 0,
                        }
                    )
                    run.log_metrics({"test_macro_f1": f1})
    assert run_kind({"finetune.encoder": "none", "finetune.model": "/m"}) == "pretrained"
    curve = aggregate_curve(read_curve_runs(["vectors"], parts=["test"], uri=uri).runs,
                            "macro_f1", ["test"])  # fmt: skip
    assert [p.values["test"].mean for p in curve.of("textcnn")] == [pytest.approx(0.41)]
    pretrained = {p.series: p.values["test"].mean for p in curve.of("pretrained")}
    assert len(pretrained) == 2 and sorted(pretrained.values()) == pytest.approx([0.51, 0.61])
    assert "TextCNN" in next(s for s, v in pretrained.items() if v > 0.6)


def test_test_and_validation_points_differ_in_marker_not_only_in_line() -> None:
    """A curve of one export is one point per part: a line style alone does not show, so
    test and validation looked the same."""
    from tibnlp.evaluation.curve import CurveRun

    runs = [CurveRun("pretrained", 1000, 1.0, {"test": 0.5, "validation": 0.6})]
    _, lines = _drawn(runs, parts=("test", "validation"))
    styles = {(line.get_marker(), line.get_fillstyle()) for line in lines}
    assert {("o", "full"), ("s", "none")} <= styles  # (error-bar caps draw "_" markers)


def test_long_legend_labels_stay_inside_the_figure(tmp_path: Path, monkeypatch) -> None:
    """Four columns of long series names ran off both sides of the PNG."""
    from tibnlp.evaluation import curve as curve_mod
    from tibnlp.evaluation.curve import CurveRun, draw_curve

    figures: list = []
    monkeypatch.setattr(curve_mod, "save_png", lambda fig, path: figures.append(fig) or path)
    long = "a-pipeline-stage-with-a-rather-long-series-name-and-its-settings"
    runs = [
        CurveRun("pretrained", t, 0.1 * t / 1000, {"test": f}, series=f"{long}-{i}")
        for i in range(4)
        for t, f in ((1000, 0.5), (2000, 0.55))
    ]
    runs.append(CurveRun("random", 0, None, {"test": 0.45}))
    draw_curve(aggregate_curve(runs, "macro_f1", ["test"]), tmp_path / "c.png")
    fig = figures[0]
    fig.canvas.draw()
    (legend,) = fig.legends
    box, frame = legend.get_window_extent(), fig.bbox
    assert frame.x0 <= box.x0 and box.x1 <= frame.x1, (box, frame)
    assert frame.y0 <= box.y0 and box.y1 <= frame.y1, (box, frame)
    axes_bottom = min(ax.get_window_extent().y0 for ax in fig.axes)
    assert box.y1 < axes_bottom  # below the panels, not over them
    from tibnlp.evaluation.plots import plt

    plt.close(fig)


def test_runs_of_two_datasets_are_refused_not_averaged(
    store: tuple[str, str], tmp_path: Path
) -> None:
    """TNCC and TUSA runs at one token count were one point: the mean of both datasets'
    seeds, and the published results (per dataset) silently left out."""
    uri, _ = store
    out = tmp_path / "mixed.png"
    args = ["runs", "plot", "-e", "curve-mixed", "-o", str(out)]
    result = CliRunner().invoke(app, [*args, "--tracking-uri", uri])
    assert isinstance(result.exception, TibnlpError), result.output
    assert "2 datasets (runs: tncc-title 12, tusa 12)" in str(result.exception)
    assert "--filter \"tags.dataset = 'tncc-title'\"" in str(result.exception.hint)
    assert not out.exists()
    result = CliRunner().invoke(
        app, [*args, "--tracking-uri", uri, "--filter", "tags.dataset = 'tusa'"]
    )
    assert result.exit_code == 0, result.output


def test_a_failed_seed_left_out_is_said(tmp_path: Path) -> None:
    """Runs left out for want of tokens were listed; a failed or running seed was left out
    without a word."""
    uri = sqlite_store(tmp_path)
    _experiment(uri, tmp_path, "curve-f", pipeline=False)
    with Tracker("curve-f", "again", uri=uri, buffer_dir=tmp_path / "buf") as parent:
        seed = parent.child("seed 4", tags={"dataset": "tncc-title"})
        seed.log_metrics({"test_macro_f1": 0.1, "validation_macro_f1": 0.1})
        seed.end("FAILED")
    read = read_curve_runs(["curve-f"], uri=uri)
    assert len(read.runs) == 12
    assert read.skipped == ["curve-f: runs with the metric not finished (1 FAILED)"]
