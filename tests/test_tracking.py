"""The tracking convention on a local store: params, tags, time-series metrics, artifacts,
nested runs, the model registry, provenance tags."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tibnlp.config import load_config
from tibnlp.errors import ConfigError
from tibnlp.tracking import Tracker, provenance_tags, tracker_from_config
from tibnlp.tracking.conventions import TAG_DATA, TAG_GIT_COMMIT, TAG_VOCAB, path_hash
from tibnlp.tracking.testing import sqlite_store


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.chdir(tmp_path)
    return sqlite_store(tmp_path)


def test_run_records_params_metrics_artifacts_and_children(store: str, tmp_path: Path) -> None:
    cfg = load_config(overrides=["model.heads.small=6", "model.heads.large=12"])
    from tibnlp.config import to_dict

    with Tracker("exp", "parent", uri=store) as parent:
        parent.log_params(to_dict(cfg))
        parent.log_dict(to_dict(cfg), "config/resolved.yaml")
        with parent.child("pretrain", tags={"tibnlp.stage": "pretrain"}) as child:
            for step in range(5):
                child.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
            child.log_text("# report\n", "reports/eval.md")
            child.log_figure(_curve(), "plots/learning_curve.png")
    client = MlflowClient(store)
    run = client.get_run(parent.run_id)
    assert run.data.params["model.heads.small"] == "6"
    assert run.data.params["pretrain.optimizer.lr"] == str(cfg.pretrain.optimizer.lr)
    assert run.info.status == "FINISHED"
    assert run.data.tags["tibnlp.git_commit"]  # every run names its code
    assert [a.path for a in client.list_artifacts(parent.run_id, "config")] == [
        "config/resolved.yaml"
    ]
    kid = client.get_run(child.run_id)
    assert kid.data.tags["mlflow.parentRunId"] == parent.run_id
    assert kid.data.tags["tibnlp.stage"] == "pretrain"
    history = client.get_metric_history(child.run_id, "loss")
    assert [m.step for m in history] == [0, 1, 2, 3, 4]
    assert history[-1].value == pytest.approx(0.2)
    assert [a.path for a in client.list_artifacts(child.run_id, "reports")] == ["reports/eval.md"]
    (plot,) = client.list_artifacts(child.run_id, "plots")
    assert plot.path == "plots/learning_curve.png" and plot.file_size > 1000
    assert not list((tmp_path / ".tibnlp/tracking-buffer/files").glob("*"))  # staging cleaned
    assert not list((tmp_path / ".tibnlp/tracking-buffer").glob("*.jsonl"))


def _curve():  # a learning curve, as stages plot them
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1, 2], [3.0, 2.0, 1.5])
    return fig


def test_failed_block_marks_run_failed(store: str) -> None:
    with pytest.raises(RuntimeError), Tracker("exp", "boom", uri=store) as tr:
        raise RuntimeError("x")
    assert MlflowClient(store).get_run(tr.run_id).info.status == "FAILED"


def test_a_stopped_block_marks_run_killed(store: str) -> None:
    """Ctrl-C and SIGTERM (`tibnlp.stopping.Stopped`) end the run KILLED, not FAILED."""
    import signal

    from tibnlp.stopping import Stopped

    with pytest.raises(KeyboardInterrupt), Tracker("exp", "stopped", uri=store) as tr:
        raise Stopped(signal.SIGTERM)
    assert MlflowClient(store).get_run(tr.run_id).info.status == "KILLED"


def test_register_model_creates_version_with_metrics(store: str, tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"\0" * 16)
    (model / "config.yaml").write_text("model: {}\n")
    with Tracker("exp", "finetune", uri=store) as tr:
        tr.register_model(model, "tibnlp-tncc-title", {"test_f1_macro": 0.61})
        tr.register_model(model, "tibnlp-tncc-title", {"test_f1_macro": 0.61}, artifact_path="m2")
    client = MlflowClient(store)
    versions = sorted(
        client.search_model_versions("name='tibnlp-tncc-title'"), key=lambda v: int(v.version)
    )
    assert [str(v.version) for v in versions] == ["1", "2"]
    assert versions[0].run_id == tr.run_id
    assert versions[0].tags["test_f1_macro"] == "0.61"
    assert versions[0].source.endswith("/model")
    files = {a.path for a in client.list_artifacts(tr.run_id, "model")}
    assert files == {"model/model.safetensors", "model/config.yaml"}
    assert client.get_run(tr.run_id).data.metrics["test_f1_macro"] == pytest.approx(0.61)


def test_provenance_tags_hash_content_not_location(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        (d / "sub").mkdir(parents=True)
        (d / "sub" / "x.txt").write_text("ཀ་ཁ་")
        (d / ".stage.json").write_text(str(d))  # hidden bookkeeping is not content
    assert path_hash(a) == path_hash(b)
    (b / "sub" / "x.txt").write_text("ཀ་ག་")
    assert path_hash(a) != path_hash(b)
    tags = provenance_tags(data=a, vocab=b / "sub" / "x.txt", parent_model=tmp_path / "absent")
    assert tags[TAG_DATA] == path_hash(a)
    assert tags[TAG_VOCAB] == path_hash(b / "sub" / "x.txt")
    assert "tibnlp.parent_model_hash" not in tags
    commit = tags[TAG_GIT_COMMIT]
    assert commit == "unknown" or len(commit.removesuffix("+dirty")) == 40


def test_a_folder_hash_reads_through_linked_folders_as_the_readers_do(tmp_path: Path) -> None:
    """`rglob` does not follow a linked folder, which the input readers read: a change in a
    file there left a pipeline stage cached on the old corpus. A folder with no linked one
    keeps its hash (existing cache keys stay)."""
    corp, extra = tmp_path / "corp", tmp_path / "extra"
    (corp / "main").mkdir(parents=True)
    extra.mkdir()
    (corp / "main" / "a.txt").write_text("ཀ་")
    before = hashlib.sha256(f"main/a.txt\0{path_hash(corp / 'main' / 'a.txt')}\n".encode())
    assert path_hash(corp) == before.hexdigest()
    (extra / "b.txt").write_text("ཁ་")
    (corp / "linked").symlink_to(extra)
    (extra / "up").symlink_to(corp)  # a link back up: no endless walk
    first = path_hash(corp)
    (extra / "b.txt").write_text("ག་ང་")  # another size: the file hash is memoised
    assert path_hash(corp) != first


def test_a_store_mlflow_will_not_open_is_a_config_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--tracking-uri ./mlruns` (MLflow 3 refuses its folder store) or a SQLite file where no
    folder can be made ended in a traceback from Tracker(); `pipeline run`, `finetune` and
    `pretrain` all open their runs there."""
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    (tmp_path / "mlruns").mkdir()
    with pytest.raises(ConfigError, match=r"cannot open the tracking store .*mlruns") as err:
        Tracker("exp", uri=str(tmp_path / "mlruns"))
    assert "MLFLOW_ALLOW_FILE_STORE=true" in (err.value.hint or "")
    assert "--set tracking.uri=sqlite:///mlflow.db" in (err.value.hint or "")  # (a stage's)
    (tmp_path / "file").write_text("")
    for uri in (str(tmp_path / "new" / "x.db"), f"sqlite:///{tmp_path}/file/x.db"):
        with pytest.raises(ConfigError, match="cannot open the tracking store") as err:
            Tracker("exp", uri=uri)
        assert "sqlite:///PATH/mlflow.db" in (err.value.hint or "")
    # a database whose driver is not installed (as `runs compare` says it)
    if importlib.util.find_spec("psycopg") is None:
        with pytest.raises(ConfigError, match="cannot open the tracking store postgresql") as err:
            Tracker("exp", uri="postgresql+psycopg://u:p@localhost:1/db")
        assert "install the database driver" in (err.value.hint or "")


def test_tracker_from_config_logs_into_the_pipeline_stage_run(store: str) -> None:
    parent = Tracker("exp", "pipeline", uri=store)
    stage = parent.child("pretrain")
    cfg = load_config(overrides=[f"tracking.uri={store}", f"tracking.run_id={stage.run_id}"])
    with tracker_from_config(cfg.tracking, "pretrain", tags={"k": "v"}) as tr:
        tr.log_metrics({"loss": 2.0}, step=3)
    assert tr.run_id == stage.run_id
    run = MlflowClient(store).get_run(stage.run_id)
    assert run.data.metrics["loss"] == 2.0 and run.data.tags["k"] == "v"
    parent.end()


@pytest.mark.parametrize("key", ["run_id", "parent_run_id"])
def test_a_run_id_the_store_does_not_know_is_refused_at_start(store: str, key: str) -> None:
    """A stage's OUTPUT/config.yaml carries the pipeline's run ids; used against another store
    it must fail at once with what to clear, not reject every later log call."""
    cfg = load_config(overrides=[f"tracking.uri={store}", f"tracking.{key}=0123abcd"])
    with pytest.raises(ConfigError, match=rf"tracking\.{key}.*0123abcd.*does not exist") as err:
        tracker_from_config(cfg.tracking, "pretrain")
    assert "--set tracking.run_id= --set tracking.parent_run_id=" in str(err.value.hint)


def test_disabled_tracker_does_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with Tracker("exp", enabled=False) as tr:
        tr.log_metrics({"a": 1.0}, step=1)
        tr.log_params({"a": 1})
        tr.child("x").log_metrics({"b": 1.0})
    assert tr.run_id is None
    assert not (tmp_path / "mlflow.db").exists()


def test_experiments_open_on_their_runs_in_mlflow_3(store: str, tmp_path: Path) -> None:
    """Without the kind tag MLflow 3 opens an experiment on its GenAI trace overview."""
    client = MlflowClient(store)
    old = client.create_experiment("made-before")  # an experiment tibnlp did not create
    for name in ("new-exp", "made-before"):
        with Tracker(name, "r", uri=store, buffer_dir=tmp_path / "buf") as tr:
            tr.log_metrics({"x": 1.0})
        exp = client.get_experiment_by_name(name)
        assert exp is not None and exp.tags["mlflow.experimentKind"] == "custom_model_development"
    assert client.get_experiment(old).tags["mlflow.experimentKind"] == "custom_model_development"


def _log_one(uri: str, buffer: str) -> str:
    with Tracker("race", "r", uri=uri, buffer_dir=buffer) as tr:
        tr.log_metrics({"x": 1.0})
    return str(tr.run_id)


def test_processes_starting_together_on_a_new_sqlite_store(tmp_path: Path) -> None:
    """Two fine-tunings started at once on a fresh ./mlflow.db: MLflow's table creation raced
    ("table runs already exists") before tibnlp created the store under a lock."""
    import multiprocessing as mp

    uri = f"sqlite:///{tmp_path / 'new' / 'mlflow.db'}"
    with mp.get_context("spawn").Pool(3) as pool:
        ids = pool.starmap(_log_one, [(uri, str(tmp_path / f"buf{i}")) for i in range(3)])
    assert len(set(ids)) == 3 and not any(i.startswith("offline-") for i in ids)
    exp = MlflowClient(uri).get_experiment_by_name("race")
    assert exp is not None and len(MlflowClient(uri).search_runs([exp.experiment_id])) == 3


def test_ctrl_c_inside_the_store_call_stops_the_run_not_a_buffered_outage(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while a call waits on the sqlite file came back as the store's own error
    ('database is locked' from its rollback, the KeyboardInterrupt as its context): it was
    taken for an outage, training went on and every later call waited on the lock. Now the
    record is kept in the buffer, the store is not touched again, and the interrupt goes on."""
    from mlflow.exceptions import MlflowException

    from tibnlp.tracking.buffer import interrupted

    tr = Tracker("exp", "ctrl-c", uri=store, buffer_dir=tmp_path / "buf")
    tr.log_metrics({"a": 1.0}, step=0)
    calls = []

    def locked_after_ctrl_c(rec: dict) -> None:
        calls.append(rec["op"])
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise MlflowException("(sqlite3.OperationalError) database is locked") from None

    monkeypatch.setattr(tr._outbox.applier, "apply", locked_after_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        tr.log_metrics({"a": 2.0}, step=1)
    assert tr.offline and len(tr.buffer) == 1
    tr.log_metrics({"a": 3.0}, step=2)
    tr.end("KILLED")
    assert calls == ["log_batch"]  # nothing after the interrupt reached the store
    assert len(tr.buffer) == 3
    assert not interrupted(MlflowException("database is locked"))  # a plain lock: an outage


def test_the_cli_says_a_store_is_unreachable_once() -> None:
    """The log line and the TrackingOutageWarning both printed, the second with a source
    line of tracker.py; the CLI keeps the log line only."""
    import warnings

    from tibnlp.cli.main import one_outage_line
    from tibnlp.tracking import TrackingOutageWarning

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        one_outage_line()
        warnings.warn(
            "tracking store http://x is unreachable (boom)", TrackingOutageWarning, stacklevel=1
        )
        warnings.warn("another warning", UserWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["another warning"]


@pytest.mark.parametrize("name", ["tibnlp-quickstart", "a/b c", ".."])
def test_a_sqlite_store_keeps_its_artifacts_beside_it_wherever_the_run_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    # MLflow's default is ./mlruns of the working directory: before, this artifact went to
    # elsewhere/mlruns/1/... and the test suite left such folders in the checkout
    store = sqlite_store(tmp_path / "store")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    with Tracker(name, "run", uri=store) as run:
        run.log_text("# report\n", "reports/eval.md")
    assert not (elsewhere / "mlruns").exists()
    (saved,) = (tmp_path / "store" / "mlruns").rglob("eval.md")
    # one folder per experiment, inside mlruns/ whatever its name
    assert saved.relative_to(tmp_path / "store" / "mlruns").parts[1:] == (
        run.run_id,
        "artifacts",
        "reports",
        "eval.md",
    )
    assert MlflowClient(store).list_artifacts(run.run_id, "reports")[0].path == "reports/eval.md"
