"""Runs commands and tracking: twins kept apart, resumed seeds counted once, a resumed run's
parent, where a buffer replays, refused param names, file modes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

import tibnlp
from tibnlp.tracking import Tracker, sync_buffers
from tibnlp.tracking.compare import compare_runs
from tibnlp.tracking.conventions import TAG_SEED_RECORD
from tibnlp.tracking.curve import read_curve_runs
from tibnlp.tracking.replay import Applier
from tibnlp.tracking.testing import sqlite_store


def _seed(
    parent: Tracker, seed: int, f1: float, params: dict, resumed: bool = False, record: str = ""
) -> None:
    """A seed run as `training/finetune.py` makes it (tag `seed`; `resumed` when re-reported;
    the seed record it reports)."""
    tags = {"seed": str(seed), **({"resumed": "true"} if resumed else {})}
    tags.update({TAG_SEED_RECORD: record} if record else {})
    with parent.child(f"seed {seed}", tags=tags) as run:
        run.log_params(params)
        run.log_metrics({"test_macro_f1": f1, "validation_macro_f1": f1})


def test_compare_keeps_the_random_init_twin_apart(tmp_path: Path) -> None:
    """README: `tibnlp finetune tncc --model M --head cnn --seeds 1,2,3`, again with
    `-s finetune.init=random`, then `tibnlp runs compare -e EXPERIMENT`: two systems."""
    uri = sqlite_store(tmp_path)
    for init, scores in (("pretrained", [0.60, 0.62, 0.64]), ("random", [0.30, 0.31, 0.32])):
        with Tracker("tibnlp", f"tncc {init}", uri=uri, buffer_dir=tmp_path / "b") as parent:
            for seed, f1 in enumerate(scores, start=1):
                params = {
                    "model": {"heads": {"small": 12, "large": 12}},
                    "finetune": {"init": init, "encoder": "albert", "head": "cnn", "model": "/m"},
                }
                _seed(parent, seed, f1, params)
            parent.log_metrics({"test_macro_f1_mean": sum(scores) / 3})
    result = compare_runs("tibnlp", ["test_macro_f1"], uri=uri)
    assert [n for _, n, _ in result.rows] == [3, 3], result.markdown()
    assert [round(cells[0].mean, 4) for _, _, cells in result.rows] == [0.62, 0.31]


def test_a_resumed_stage_counts_each_seed_once(tmp_path: Path) -> None:
    """A pipeline interrupted during seed 3 and run again: the stage run is resumed and
    `_run_seed` re-reports seeds 1 and 2 in new runs (tag resumed=true) beside the originals."""
    uri = sqlite_store(tmp_path)
    params = {"finetune": {"init": "pretrained", "head": "cnn", "model": "/m"},
              "pretrain": {"tokens": 1000, "train_seconds": 36}}  # fmt: skip
    with Tracker("pipe", "p", uri=uri, buffer_dir=tmp_path / "b") as pipeline:
        stage = pipeline.child("finetune", tags={"tibnlp.model": "m"})
        _seed(stage, 1, 0.60, params)
        _seed(stage, 2, 0.62, params)
        stage.child("seed 3", tags={"seed": "3"}).end("KILLED")
        stage.end("FAILED")
    with Tracker("pipe", "p", uri=uri, buffer_dir=tmp_path / "b") as pipeline:
        again = pipeline.child("finetune", resume_run_id=stage.run_id)
        _seed(again, 1, 0.60, params, resumed=True)
        _seed(again, 2, 0.62, params, resumed=True)
        _seed(again, 3, 0.70, params)
        again.end()
    result = compare_runs("pipe", ["test_macro_f1"], uri=uri)
    (_, n, cells), *_ = result.rows
    assert n == 3 and cells[0].mean == pytest.approx(0.64), result.markdown()
    assert len(read_curve_runs(["pipe"], uri=uri).runs) == 3  # `runs plot` too


def test_a_standalone_rerun_counts_each_seed_record_once(tmp_path: Path) -> None:
    """`tibnlp finetune` run again into its output folder: a new parent run, the finished
    seeds re-reported under it with the record they report (seed 3 is new)."""
    uri = sqlite_store(tmp_path)
    params = {"finetune": {"init": "pretrained", "head": "cnn", "model": "/m"},
              "pretrain": {"tokens": 1000, "train_seconds": 36}}  # fmt: skip
    with Tracker("solo", "first", uri=uri, buffer_dir=tmp_path / "b") as first:
        _seed(first, 1, 0.60, params, record="r1")
        _seed(first, 2, 0.62, params, record="r2")
    with Tracker("solo", "again", uri=uri, buffer_dir=tmp_path / "b") as again:
        _seed(again, 1, 0.60, params, resumed=True, record="r1")
        _seed(again, 2, 0.62, params, resumed=True, record="r2")
        _seed(again, 3, 0.70, params, record="r3")
    (_, n, cells), *_ = compare_runs("solo", ["test_macro_f1"], uri=uri).rows
    assert n == 3 and cells[0].mean == pytest.approx(0.64)
    assert len(read_curve_runs(["solo"], uri=uri).runs) == 3  # `runs plot` too


def test_a_resumed_child_moves_under_its_new_parent_even_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Tracker.child(resume_run_id=...)` is "a run nested under this one"; a pipeline run
    again resumes its interrupted stage's run under the new pipeline run."""
    uri = sqlite_store(tmp_path)
    buf = tmp_path / "b"
    with Tracker("pipe", "first", uri=uri, buffer_dir=buf) as first:
        stage = first.child("finetune")
        stage.end("FAILED")
    with Tracker("pipe", "second", uri=uri, buffer_dir=buf) as second:
        second.child("finetune", resume_run_id=stage.run_id).end()
    client = MlflowClient(uri)
    assert client.get_run(str(stage.run_id)).data.tags["mlflow.parentRunId"] == second.run_id

    real_apply = Applier.apply

    def down(self: Applier, rec: dict) -> None:  # the store does not answer
        raise ConnectionError("store down")

    monkeypatch.setattr(Applier, "apply", down)
    with pytest.warns(UserWarning):
        third = Tracker("pipe", "third", uri=uri, buffer_dir=buf, retry_seconds=0)
    assert str(third.run_id).startswith("offline-")
    child = third.child("finetune", resume_run_id=stage.run_id)
    child.end()
    monkeypatch.setattr(Applier, "apply", real_apply)  # back: replayed at end()
    third.end()
    sync_buffers(buf)
    parent = client.get_run(str(stage.run_id)).data.tags["mlflow.parentRunId"]
    assert parent == third.run_id and not parent.startswith("offline-")


def test_a_buffer_replays_into_the_store_it_was_made_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Default store `sqlite:///mlflow.db` (relative): a buffer written in project/ and synced
    later from elsewhere with the path the warning prints must reach project/mlflow.db."""
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    elsewhere.mkdir()
    sqlite_store(project)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(project)

    def down(self: Applier, rec: dict) -> None:
        raise ConnectionError("database is locked")

    real_apply = Applier.apply
    monkeypatch.setattr(Applier, "apply", down)
    with pytest.warns(UserWarning), Tracker("exp", "r") as run:
        run.log_metrics({"loss": 1.0})
    monkeypatch.setattr(Applier, "apply", real_apply)
    # `tibnlp runs sync` is a new process (in this one MLflow caches the store by its URI)
    buffers = project / ".tibnlp" / "tracking-buffer"
    cmd = [sys.executable, "-m", "tibnlp.cli.main", "runs", "sync", str(buffers)]
    env = {**os.environ, "PYTHONPATH": str(Path(tibnlp.__file__).parents[1])}
    done = subprocess.run(cmd, cwd=elsewhere, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "replayed 3 buffered tracking calls" in done.stdout + done.stderr
    assert not (elsewhere / "mlflow.db").exists()
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    assert client.get_experiment_by_name("exp") is not None


def test_a_plot_is_as_readable_as_any_file_written_here(tmp_path: Path) -> None:
    """`runs plot` / confusion PNGs go through `atomic_file`, whose mkstemp makes them 0600:
    a shared result nobody else can open (folders get the umask's mode: `staged_dir`)."""
    from tibnlp.evaluation.plots import plt, save_png

    umask = os.umask(0o022)
    try:
        fig, _ = plt.subplots()
        png = save_png(fig, tmp_path / "curve.png")
        assert png.stat().st_mode & 0o777 == 0o644
    finally:
        os.umask(umask)


def test_a_param_name_mlflow_refuses_loses_only_itself(tmp_path: Path) -> None:
    """Pipeline `vars` (and stage params) are named by the user, e.g. in Tibetan: one name
    MLflow refuses made the store reject the whole batch, every other param with it."""
    uri = sqlite_store(tmp_path)
    with Tracker("e", "r", uri=uri, buffer_dir=tmp_path / "b") as run:
        run.log_params({"vars": {"steps": 200, "ཚད་": 3, "lr(head)": 0.1}})
    params = MlflowClient(uri).get_run(str(run.run_id)).data.params
    assert params.get("vars.steps") == "200", params
    assert sorted(params.values()) == ["0.1", "200", "3"]
