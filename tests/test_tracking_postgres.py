"""The team deployment the README recommends, for real: `mlflow server` on a PostgreSQL server
(started here on 127.0.0.1), the smoke pipeline logged to it, and a server outage mid-run that
loses nothing. Skipped, with the reason, where PostgreSQL or the data directory is absent."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from tests.pg_server import postgres, why_not
from tibnlp.pipeline.runner import run_pipeline
from tibnlp.pipeline.spec import load_pipeline
from tibnlp.tracking import Tracker, TrackingOutageWarning
from tibnlp.tracking.server import free_port, start_server, stop_server, wait_until_up

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(why_not()), reason=why_not())]

SMOKE = Path(__file__).resolve().parents[1] / "pipelines" / "smoke.yaml"
STAGES = ["slice", "prepare", "vocab", "pretrain", "finetune"]


def _serve(db: str, tmp: Path, port: int):  # type: ignore[no-untyped-def]
    proc = start_server(db, port=port, artifacts=tmp / "artifacts", log_file=tmp / "mlflow.log")
    wait_until_up(f"http://127.0.0.1:{port}", proc)
    return proc


def test_smoke_pipeline_on_mlflow_over_postgresql(
    corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    with postgres(free_port()) as db:
        proc = _serve(db, tmp_path, port)
        try:
            overrides = [
                "vars.docs=150",
                "vars.steps=6",
                "engine.threads=1",
                "tracking.register_model=smoke-title",
            ]
            spec = load_pipeline(SMOKE, overrides)
            result = run_pipeline(spec, tracking_uri=uri, echo=lambda _: None, workdir=tmp_path)
            assert result.ran == STAGES
            client = MlflowClient(uri)
            exp = client.get_experiment_by_name("tibnlp-smoke")
            runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
            assert set(runs) == {"smoke", "seed 1", *STAGES}  # seed 1: finetune's child
            parent = runs["smoke"].info.run_id
            for name in STAGES:  # nested under the pipeline's run, finished
                assert runs[name].data.tags["mlflow.parentRunId"] == parent, name
                assert runs[name].info.status == "FINISHED", name
            pre, fin = runs["pretrain"], runs["finetune"]
            assert pre.data.params["pretrain.max_steps"] == "6"
            assert len(client.get_metric_history(pre.info.run_id, "train/loss")) >= 2
            assert 0.0 <= fin.data.metrics["test_macro_f1_mean"] <= 1.0
            seeds = client.search_runs(
                [exp.experiment_id], f"tags.mlflow.parentRunId = '{fin.info.run_id}'"
            )
            assert seeds, "the finetune stage's per-seed runs"
            found = {a.path for a in client.list_artifacts(seeds[0].info.run_id, "confusion")}
            assert found and all(p.endswith(".png") for p in found)
            assert client.download_artifacts(seeds[0].info.run_id, next(iter(found)), str(tmp_path))
            versions = client.search_model_versions("name = 'smoke-title'")
            assert len(versions) == 1 and versions[0].status == "READY"

            from tibnlp.cli.main import app

            out = CliRunner().invoke(
                app, ["runs", "compare", "-e", "tibnlp-smoke", "--tracking-uri", uri, "-f", "csv"]
            )
            assert out.exit_code == 0, out.output
            assert "test_macro_f1" in out.output and len(out.output.splitlines()) >= 2

            # params past PostgreSQL's old 500-character column, and past MLflow's limit
            with Tracker("pg-params", "long", uri=uri, buffer_dir=tmp_path / "buf") as tr:
                tr.log_params({"a": {"long": "x" * 5000, "longer": "y" * 9000}})
            got = client.get_run(tr.run_id).data.params
            assert got["a.long"] == "x" * 5000 and got["a.longer"].startswith("y" * 5000)

            # the server goes away mid-run and comes back on the same database
            run = Tracker(
                "pg-outage", "train", uri=uri, buffer_dir=tmp_path / "buf", retry_seconds=0.2
            )
            for step in range(10):
                run.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
            stop_server(proc)
            with pytest.warns(TrackingOutageWarning):
                for step in range(10, 20):
                    run.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
            proc = _serve(db, tmp_path, port)
            time.sleep(0.5)  # let the probe interval pass
            for step in range(20, 30):
                run.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
            run.end()
            steps = sorted(m.step for m in client.get_metric_history(run.run_id, "loss"))
            assert steps == list(range(30))
        finally:
            stop_server(proc)
