"""A pipeline killed with SIGKILL leaves its MLflow runs RUNNING; the next run in its work dir
ends them KILLED (tibnlp.tracking.orphans)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tibnlp.pipeline.context import StageContext
from tibnlp.pipeline.registry import register_stage
from tibnlp.pipeline.runner import run_pipeline
from tibnlp.pipeline.spec import load_pipeline
from tibnlp.tracking.orphans import LEDGER, close_run, end_orphans, open_run
from tibnlp.tracking.testing import sqlite_store

ROOT = Path(__file__).resolve().parents[1]
DIE = "TIBNLP_TEST_DIE_IN_STAGE"  # a stage named here SIGKILLs its own process


def _write(ctx: StageContext) -> Path:
    ctx.tracker.log_metrics({"loss": 1.0}, step=0)
    if os.environ.get(DIE) == ctx.name:
        os.kill(os.getpid(), signal.SIGKILL)
    out = ctx.output / "out.txt"
    out.write_text(ctx.name, encoding="utf-8")
    return out


register_stage("o_write", _write, ("pretrain",))

PIPELINE = """
name: orphans
experiment: orphans-exp
workdir: {workdir}
config:
  tracking: {{uri: "{uri}"}}
stages:
  first:
    kind: o_write
    inputs: ["data:corpora/toy.txt"]
  second:
    kind: o_write
    inputs: ["${{stages.first.output}}"]
"""


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    data = tmp_path / "data" / "corpora"
    data.mkdir(parents=True)
    (data / "toy.txt").write_text("ཀ་ཁ།\n", encoding="utf-8")
    monkeypatch.setenv("TIBNLP_DATA", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    uri = sqlite_store(tmp_path)
    path = tmp_path / "orphans.yaml"
    path.write_text(PIPELINE.format(workdir=tmp_path / "work", uri=uri), encoding="utf-8")
    return path, uri


def _runs(uri: str) -> list[tuple[str, str]]:
    """(run name, status) of every run of the experiment, oldest first."""
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("orphans-exp")
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])
    return [(r.info.run_name, r.info.status) for r in runs]


def test_a_killed_pipelines_runs_are_ended_by_the_next_run(toy: tuple[Path, str]) -> None:
    path, uri = toy
    code = (
        "import sys; from tests import test_pipeline_orphans as t; "
        "from tibnlp.pipeline.runner import run_pipeline; "
        "from tibnlp.pipeline.spec import load_pipeline; "
        "run_pipeline(load_pipeline(t.Path(sys.argv[1])), echo=lambda _: None)"
    )
    env = {**os.environ, DIE: "second", "PYTHONPATH": str(ROOT)}
    died = subprocess.run([sys.executable, "-c", code, str(path)], env=env, cwd=path.parent)
    assert died.returncode == -signal.SIGKILL
    assert _runs(uri) == [("orphans", "RUNNING"), ("first", "FINISHED"), ("second", "RUNNING")]
    work = path.parent / "work"
    assert (work / LEDGER).is_file()

    lines: list[str] = []
    again = run_pipeline(load_pipeline(path), echo=lines.append)
    assert again.ran == ["second"] and again.skipped == ["first"]
    assert any("was killed" in ln and "2 marked KILLED" in ln for ln in lines)
    # the dead parent stays KILLED; its open stage was ended too, then resumed (its run
    # continued from the partial output, under the new parent) and finished
    assert _runs(uri) == [
        ("orphans", "KILLED"),
        ("first", "FINISHED"),
        ("second", "FINISHED"),
        ("orphans", "FINISHED"),
    ]
    assert not (work / LEDGER).exists()  # a clean end leaves no note


def test_a_ledger_on_a_store_that_answers_is_cleared_and_ends_only_running_runs(
    tmp_path: Path,
) -> None:
    uri = sqlite_store(tmp_path)
    client = MlflowClient(uri)
    exp = client.create_experiment("e")
    parent = client.create_run(exp).info.run_id
    done = client.create_run(exp, tags={"mlflow.parentRunId": parent}).info.run_id
    client.set_terminated(done, "FINISHED")
    open_run(tmp_path, parent, uri)
    notes: list[str] = []
    assert end_orphans(tmp_path, notes.append) == [parent]
    assert client.get_run(parent).info.status == "KILLED"
    assert client.get_run(done).info.status == "FINISHED"  # an ended child keeps its status
    assert not (tmp_path / LEDGER).exists() and notes
    assert end_orphans(tmp_path, notes.append) == []  # nothing noted any more


def test_an_unreadable_or_offline_ledger_is_not_an_error(tmp_path: Path) -> None:
    open_run(tmp_path, "offline-" + "0" * 32, "sqlite:///x.db")  # an id the store never gave
    assert not (tmp_path / LEDGER).exists()
    (tmp_path / LEDGER).write_text("{not json", encoding="utf-8")
    notes: list[str] = []
    assert end_orphans(tmp_path, notes.append) == []
    assert "unreadable" in notes[0] and not (tmp_path / LEDGER).exists()
    gone = tmp_path / "gone.db"  # a store deleted since: dropped, not made again empty
    open_run(tmp_path, "0" * 32, f"sqlite:///{gone}")
    assert end_orphans(tmp_path, notes.append) == [] and not gone.exists()
    assert not (tmp_path / LEDGER).exists()


def test_a_run_the_store_could_not_end_stays_noted_beside_the_next_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next run's own note and its clean end leave the unreachable run noted (it was lost
    when the ledger held one run), and an older one-run ledger still reads."""
    retries = "MLFLOW_HTTP_REQUEST_MAX_RETRIES"
    for key in (retries, "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.setenv(key, "")  # (restored, i.e. unset, after the test)
        monkeypatch.delenv(key)
    down = "http://127.0.0.1:9"
    open_run(tmp_path, "a" * 32, down)
    open_run(tmp_path, "b" * 32, down)  # the same store: asked once, not once per run
    notes: list[str] = []
    assert end_orphans(tmp_path, notes.append) == []
    # MLflow's own retries (minutes against a refused port) were shortened before asking
    assert os.environ[retries] == "2" and len(notes) == 1
    assert "aaaa" in notes[-1] and "kept in" in notes[-1] and (tmp_path / LEDGER).is_file()
    uri = sqlite_store(tmp_path)
    client = MlflowClient(uri)
    mine = client.create_run(client.create_experiment("e")).info.run_id
    open_run(tmp_path, mine, uri)  # the run now open, beside the one not ended
    close_run(tmp_path, mine)  # its clean end removes its own entry only
    text = (tmp_path / LEDGER).read_text(encoding="utf-8")
    assert "a" * 32 in text and "b" * 32 in text and mine not in text

    legacy = tmp_path / "legacy"
    legacy.mkdir()
    dead = client.create_run(client.get_experiment_by_name("e").experiment_id).info.run_id
    (legacy / LEDGER).write_text(f'{{"run_id": "{dead}", "uri": "{uri}"}}\n', encoding="utf-8")
    assert end_orphans(legacy, notes.append) == [dead]
    assert client.get_run(dead).info.status == "KILLED" and not (legacy / LEDGER).exists()


@pytest.mark.parametrize(
    "code, message",
    [
        ("PERMISSION_DENIED", "not allowed"),
        # what MLflow's database store says of a database file it may not write
        (
            "TEMPORARILY_UNAVAILABLE",
            "(sqlite3.OperationalError) attempt to write a readonly database",
        ),
    ],
    ids=["denied", "read-only-sqlite"],
)
def test_a_store_that_keeps_refusing_has_the_run_dropped_with_how_to_end_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: str, message: str
) -> None:
    """A lasting refusal was noted again on every run, for good: after GIVE_UP_AFTER runs
    the entry goes, with a note naming the call that ends it by hand. A locked database
    passes: it stays noted."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos import databricks_pb2

    from tibnlp.tracking import orphans

    uri = sqlite_store(tmp_path)
    client = MlflowClient(uri)
    dead = client.create_run(client.create_experiment("e")).info.run_id
    open_run(tmp_path, dead, uri)
    error = message

    def refuse(self: MlflowClient, run_id: str) -> None:
        raise MlflowException(error, error_code=getattr(databricks_pb2, code))

    monkeypatch.setattr(MlflowClient, "get_run", refuse)
    notes: list[str] = []
    for _ in range(orphans.GIVE_UP_AFTER - 1):
        assert end_orphans(tmp_path, notes.append) == []
        assert dead in (tmp_path / LEDGER).read_text(encoding="utf-8")
        assert "kept in" in notes[-1]
    assert end_orphans(tmp_path, notes.append) == []
    assert not (tmp_path / LEDGER).exists()
    assert "no longer noted" in notes[-1] and "kept in" not in notes[-1]
    assert f"set_terminated('{dead}', 'KILLED')" in notes[-1]
    assert len(notes) == orphans.GIVE_UP_AFTER  # one note a run

    open_run(tmp_path, dead, uri)
    error = "(sqlite3.OperationalError) database is locked"  # passes: asked again and again
    code = "TEMPORARILY_UNAVAILABLE"
    for _ in range(orphans.GIVE_UP_AFTER + 1):
        assert end_orphans(tmp_path, notes.append) == []
    assert dead in (tmp_path / LEDGER).read_text(encoding="utf-8")


def test_a_run_deleted_in_the_ui_is_not_refused_but_its_running_children_end(
    tmp_path: Path,
) -> None:
    """The store refuses to end a deleted run: that was a refusal on every run. Its children
    still RUNNING are ended."""
    uri = sqlite_store(tmp_path)
    client = MlflowClient(uri)
    exp = client.create_experiment("e")
    parent = client.create_run(exp).info.run_id
    child = client.create_run(exp, tags={"mlflow.parentRunId": parent}).info.run_id
    client.delete_run(parent)
    open_run(tmp_path, parent, uri)
    notes: list[str] = []
    assert end_orphans(tmp_path, notes.append) == [child]
    assert client.get_run(child).info.status == "KILLED"
    assert not (tmp_path / LEDGER).exists()
