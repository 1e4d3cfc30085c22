"""A real `mlflow server` on loopback goes away mid-run and comes back: training goes on,
every metric step arrives exactly once, runs created while it was away are replayed by
`tibnlp runs sync`."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from tibnlp.tracking import Tracker, TrackingOutageWarning
from tibnlp.tracking.server import free_port, start_server, stop_server, wait_until_up
from tibnlp.tracking.testing import sqlite_store

pytestmark = pytest.mark.slow


def _serve(tmp: Path, port: int):
    store = tmp / "server.db"
    proc = start_server(
        f"sqlite:///{store}" if store.exists() else sqlite_store(tmp, "server.db"),
        port=port,
        artifacts=tmp / "artifacts",
        log_file=tmp / "server.log",
    )
    wait_until_up(f"http://127.0.0.1:{port}", proc)
    return proc


def test_outage_mid_run_loses_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    buffers = tmp_path / "buffer"
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    proc = _serve(tmp_path, port)
    try:
        run = Tracker("outage", "train", uri=uri, buffer_dir=buffers, retry_seconds=0.2)
        run.log_params({"pretrain": {"max_steps": 40}})
        for step in range(10):
            run.log_metrics({"loss": 10.0 - step * 0.1, "lr": 1e-3}, step=step)
        stop_server(proc)

        with pytest.warns(TrackingOutageWarning) as caught:
            for step in range(10, 30):
                run.log_metrics({"loss": 10.0 - step * 0.1, "lr": 1e-3}, step=step)
            run.set_tags({"during": "outage"})
            # a run started while the server is away, with a nested stage run
            late = Tracker("outage", "late", uri=uri, buffer_dir=buffers, retry_seconds=3600)
            kid = late.child("stage")
            kid.log_metrics({"acc": 0.5}, step=1)
            kid.log_text("hello", "reports/r.txt")
            kid.end()
            late.end()
        assert run.offline
        assert sum(issubclass(w.category, TrackingOutageWarning) for w in caught) == 1

        proc = _serve(tmp_path, port)
        import time

        time.sleep(0.3)  # let the probe interval pass
        for step in range(30, 40):
            run.log_metrics({"loss": 10.0 - step * 0.1, "lr": 1e-3}, step=step)
        assert not run.offline
        run.end()
        assert not run.buffer.path.exists()

        client = MlflowClient(uri)
        for key in ("loss", "lr"):
            steps = [m.step for m in client.get_metric_history(run.run_id, key)]
            assert sorted(steps) == list(range(40)), key
        data = client.get_run(run.run_id)
        assert data.data.tags["during"] == "outage"
        assert data.data.params["pretrain.max_steps"] == "40"
        assert data.info.status == "FINISHED"

        # the runs created offline are still buffered; `tibnlp runs sync` sends them
        from tibnlp.cli.main import app

        assert len(list(buffers.glob("*.jsonl"))) == 2
        result = CliRunner().invoke(app, ["runs", "sync", str(buffers)])
        assert result.exit_code == 0, result.output
        assert not list(buffers.glob("*.jsonl"))
        exp = client.get_experiment_by_name("outage")
        runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
        assert set(runs) == {"train", "late", "stage"}
        stage = runs["stage"]
        assert stage.data.tags["mlflow.parentRunId"] == runs["late"].info.run_id
        assert [m.step for m in client.get_metric_history(stage.info.run_id, "acc")] == [1]
        assert [a.path for a in client.list_artifacts(stage.info.run_id, "reports")] == [
            "reports/r.txt"
        ]
        assert stage.info.status == "FINISHED"
    finally:
        stop_server(proc)
