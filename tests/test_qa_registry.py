"""The model registry as a user meets it: what `tracking.register_model` registers from a
fine-tuning stage (the best seed's classifier folder, loadable by `tibnlp predict`, with its
scores and provenance), and what a registration does when the store goes away or races."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST
from mlflow.tracking import MlflowClient

from tibnlp.tracking import Tracker, TrackingOutageWarning
from tibnlp.tracking.replay import Applier
from tibnlp.tracking.testing import sqlite_store


def _model(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"\1" * 16)
    (folder / "classifier.yaml").write_text("format: 1\n")
    return folder


def _download(uri: str, name: str, version: str, dst: Path) -> Path:
    import mlflow

    where = mlflow.artifacts.download_artifacts(
        artifact_uri=f"models:/{name}/{version}", dst_path=str(dst), tracking_uri=uri
    )
    return Path(where)


def test_pipeline_registers_the_best_seed_that_predict_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the version was the results folder of every seed (`tibnlp predict` refused
    it: "holds the classifiers of 2 seed(s)"), tagged with the seeds' means, and nothing said
    which seed or which data produced it."""
    from typer.testing import CliRunner

    from tests.ft_fixtures import make_data_dir, make_vocab
    from tibnlp.cli.main import app
    from tibnlp.pipeline.runner import run_pipeline
    from tibnlp.pipeline.spec import load_pipeline

    monkeypatch.setenv("TIBNLP_DATA", str(make_data_dir(tmp_path / "data")))
    monkeypatch.chdir(tmp_path)
    vocab = make_vocab(tmp_path / "vocab")
    uri = sqlite_store(tmp_path)
    finetune = {
        "vocab": str(vocab),
        "encoder": "none",
        "epochs": 2,
        "embedding_size": 16,
        "cnn_channels": 8,
        "seeds": [1, 2],
        "optimizer": {"lr": 0.01},
    }
    spec = tmp_path / "p.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "qa",
                "experiment": "qa-reg",
                "workdir": str(tmp_path / "work"),
                "config": {
                    "tracking": {"uri": uri, "register_model": "qa-title"},
                    "finetune": finetune,
                },
                "stages": {"ft": {"kind": "finetune"}},
            }
        )
    )
    result = run_pipeline(load_pipeline(spec), echo=lambda _: None)
    client = MlflowClient(uri)
    (version,) = client.search_model_versions("name='qa-title'")

    # the seed registered is the one with the best validation macro-F1, and it says so
    records = [
        json.loads(p.read_text())
        for p in sorted(result.outputs["ft"].rglob("seed-*/seed_result.json"))
    ]
    assert len(records) == 2
    best = max(records, key=lambda r: r["metrics"]["validation"]["summary"]["macro_f1"])
    tags = version.tags
    assert tags["tibnlp.seed"] == str(best["seed"])
    assert "validation_macro_f1" in tags["tibnlp.selected_by"]
    assert f"seed {best['seed']}" in version.description
    assert "Pipeline stage ft (run " in version.description  # run_finetune, in a stage
    test_f1 = best["metrics"]["test"]["summary"]["macro_f1"]
    assert float(tags["test_macro_f1"]) == pytest.approx(test_f1, abs=1e-5)
    assert tags["tibnlp.seed_record"] == best["record_id"]
    assert result.results["ft"]["registered_seed"] == best["seed"]

    # provenance: code, data and vocabulary hashes, the runs behind it
    stage_run = client.get_run(version.run_id)
    assert tags["tibnlp.stage_run"] == version.run_id
    for key in ("tibnlp.git_commit", "tibnlp.data_hash", "tibnlp.vocab_hash"):
        assert tags[key] == stage_run.data.tags[key], key
    assert tags["tibnlp.pipeline_run"] == result.run_id
    assert client.get_run(tags["tibnlp.seed_run"]).data.tags["seed"] == str(best["seed"])
    assert "tibnlp predict" in (client.get_registered_model("qa-title").description or "")

    # downloaded as it is, it is a classifier folder `tibnlp predict` runs
    folder = _download(uri, "qa-title", "1", tmp_path / "download")
    texts = tmp_path / "in.jsonl"
    texts.write_text(json.dumps({"text": "རྒྱལ ཁབ སྲིད"}, ensure_ascii=False) + "\n", "utf-8")
    out = tmp_path / "out.jsonl"
    done = CliRunner().invoke(
        app, ["predict", "--model", str(folder), "--input", str(texts), "-o", str(out)]
    )
    assert done.exit_code == 0, done.output
    (row,) = [json.loads(line) for line in out.read_text("utf-8").splitlines()]
    assert row["prediction"] in ("Politics", "Economics", "Education")


def test_standalone_finetune_registers_its_best_seed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tracking.register_model` was read by pipeline stages only: `tibnlp finetune` with it
    set registered nothing, silently. It registers the best seed on validation now, as a
    stage does, from its own run."""
    from tests.ft_fixtures import make_data_dir, make_vocab, tiny_textcnn
    from tibnlp.config import load_config
    from tibnlp.training.finetune import run_finetune

    monkeypatch.setenv("TIBNLP_DATA", str(make_data_dir(tmp_path / "data")))
    monkeypatch.chdir(tmp_path)
    uri = sqlite_store(tmp_path)
    overrides = tiny_textcnn(make_vocab(tmp_path / "vocab"), tmp_path / "runs")
    overrides += [
        "tracking.enabled=true",
        f"tracking.uri={uri}",
        "tracking.register_model=qa-alone",
        "finetune.seeds=[1,2]",
    ]
    result = run_finetune(load_config(None, overrides), "tncc")
    client = MlflowClient(uri)
    (version,) = client.search_model_versions("name='qa-alone'")
    best = max(result.seeds, key=lambda s: s.metrics["validation"]["macro_f1"])
    assert version.tags["tibnlp.seed"] == str(best.seed)
    assert version.tags["tibnlp.seed_run"] == best.run_id
    assert "tibnlp.pipeline_run" not in version.tags
    run = client.get_run(version.run_id)  # the command's own run, parent of the seed runs
    assert client.get_run(best.run_id).data.tags["mlflow.parentRunId"] == run.info.run_id
    assert "`tibnlp finetune` run" in version.description
    folder = _download(uri, "qa-alone", "1", tmp_path / "download")
    assert (folder / "classifier.yaml").is_file()

    # the same command again reports the finished seeds: their best is registered already
    again = run_finetune(load_config(None, overrides), "tncc")
    assert again.registered_seed == best.seed
    assert len(client.search_model_versions("name='qa-alone'")) == 1
    # another process of a data-parallel launch (RANK 1) neither logs nor registers: under
    # torchrun each process made its own runs, and (once registering in stages) its version
    experiments = [e.experiment_id for e in client.search_experiments()]
    before = len(client.search_runs(experiments))
    monkeypatch.setenv("RANK", "1")
    other = run_finetune(load_config(None, [*overrides, "tracking.register_model=qa-rank"]), "tncc")
    assert other.registered_model == "" and not client.search_model_versions("name='qa-rank'")
    assert len(client.search_runs(experiments)) == before


def test_outage_mid_registration_still_registers_the_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store goes away as the model folder is uploaded; the stage's partial folder is then
    published (renamed) before the buffer is replayed. Before: the buffered upload named the
    old path ("no longer exists", dropped) and the version was registered pointing at an
    empty artifact folder."""
    uri = sqlite_store(tmp_path)
    partial = tmp_path / "stage.partial"
    model = _model(partial / "seed-1")
    tracker = Tracker("reg", "finetune", uri=uri, buffer_dir=tmp_path / "buf", retry_seconds=3600)
    real = Applier._op_log_artifact

    def gone(self: Applier, rec: dict) -> None:
        raise ConnectionError("the tracking server went away")

    monkeypatch.setattr(Applier, "_op_log_artifact", gone)
    with pytest.warns(TrackingOutageWarning):
        tracker.register_model(model, "qa-outage", {"test_macro_f1": 0.5})
    assert tracker.offline
    monkeypatch.setattr(Applier, "_op_log_artifact", real)
    os.replace(partial, tmp_path / "stage")  # the pipeline publishes the stage's output
    tracker.end()  # the store answers again: the buffer is replayed

    assert not tracker.buffer.pending()
    (version,) = MlflowClient(uri).search_model_versions("name='qa-outage'")
    assert version.tags["test_macro_f1"] == "0.5"
    folder = _download(uri, "qa-outage", "1", tmp_path / "download")
    assert (folder / "model.safetensors").read_bytes() == b"\1" * 16
    assert (folder / "classifier.yaml").is_file()
    assert not (tmp_path / "buf" / "files").exists()  # the staged copy is cleaned up


def test_no_version_of_an_upload_that_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: when the model folder's upload was refused, the version was created anyway,
    and `models:/NAME/1` downloaded an empty folder."""
    from tibnlp.errors import DataError

    uri = sqlite_store(tmp_path)
    model = _model(tmp_path / "clf")

    def refused(self: Applier, rec: dict) -> None:
        raise DataError("artifact upload refused")

    monkeypatch.setattr(Applier, "_op_log_artifact", refused)
    with Tracker("reg", "finetune", uri=uri, buffer_dir=tmp_path / "buf") as tracker:
        tracker.register_model(model, "qa-empty", {"test_macro_f1": 0.5})
    assert MlflowClient(uri).search_model_versions("name='qa-empty'") == []


def test_registered_model_created_meanwhile_by_another_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two fine-tunings registering a new name at once: the one that looked first and created
    second got RESOURCE_ALREADY_EXISTS, and its version was never created (a warning only)."""
    uri = sqlite_store(tmp_path)
    model = _model(tmp_path / "clf")
    MlflowClient(uri).create_registered_model("qa-race")  # the other process, meanwhile

    def not_yet(self: MlflowClient, name: str) -> None:
        raise MlflowException(f"{name} not found", error_code=RESOURCE_DOES_NOT_EXIST)

    monkeypatch.setattr(MlflowClient, "get_registered_model", not_yet)
    with Tracker("reg", "finetune", uri=uri, buffer_dir=tmp_path / "buf") as tracker:
        tracker.register_model(model, "qa-race", {"test_macro_f1": 0.5})
    monkeypatch.undo()
    (version,) = MlflowClient(uri).search_model_versions("name='qa-race'")
    assert version.run_id == tracker.run_id


def test_param_names_made_alike_do_not_drop_the_batch(tmp_path: Path) -> None:
    """A pipeline's `vars` named 'a,b' and 'a_b' (MLflow refuses ','), or two names alike in
    their first 250 characters: before, both became one key and the store refused the whole
    batch ("Duplicate parameter keys"), every other param of it lost with them."""
    uri = sqlite_store(tmp_path)
    long = "k" * 300
    with Tracker("reg", "params", uri=uri, buffer_dir=tmp_path / "buf") as tracker:
        tracker.log_params({"vars": {"a,b": 1, "a_b": 2, "lr": 3}})
        tracker.log_params({long + "x": "x", long + "y": "y"})
    params = MlflowClient(uri).get_run(tracker.run_id).data.params
    assert params["vars.lr"] == "3"
    assert params["vars.a_b"] == "1"  # the first keeps its name, the other gets a hash
    assert sorted(v for k, v in params.items() if k.startswith("vars.a_b")) == ["1", "2"]
    assert sorted(v for k, v in params.items() if k.startswith("k")) == ["x", "y"]
    assert all(len(k) <= 250 for k in params)


def test_a_registration_buffered_offline_is_not_made_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rerun of a finished fine-tuning while the store is down cannot ask the registry
    whether its seed is registered (`existing_version`), so it registers it again, buffered.
    Replayed, that registration finds the seed's version and makes none; another seed's
    registration is made."""
    uri = sqlite_store(tmp_path)
    model = _model(tmp_path / "clf")
    once = {"tibnlp.seed_record": "record-1"}
    with Tracker("reg", "first", uri=uri) as tracker:
        tracker.register_model(model, "qa-once", tags=once, unique_tag="tibnlp.seed_record")
    real = Applier._op_log_artifact

    def gone(self: Applier, rec: dict) -> None:
        raise ConnectionError("the tracking server went away")

    monkeypatch.setattr(Applier, "_op_log_artifact", gone)
    tracker = Tracker("reg", "rerun", uri=uri, buffer_dir=tmp_path / "buf", retry_seconds=3600)
    with pytest.warns(TrackingOutageWarning):
        tracker.register_model(model, "qa-once", tags=once, unique_tag="tibnlp.seed_record")
    other = {"tibnlp.seed_record": "record-2"}
    tracker.register_model(model, "qa-once", tags=other, unique_tag="tibnlp.seed_record")
    assert tracker.offline
    monkeypatch.setattr(Applier, "_op_log_artifact", real)
    tracker.end()  # the store answers again: the buffer is replayed

    assert not tracker.buffer.pending()
    versions = MlflowClient(uri).search_model_versions("name='qa-once'")
    assert sorted(v.tags["tibnlp.seed_record"] for v in versions) == ["record-1", "record-2"]
