"""`tibnlp runs ...`, `tibnlp ui` and `tibnlp model memory` on inputs a user gets wrong: a clear
error naming what to change, no traceback, no store created, no buffered call lost unsaid."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from tibnlp.cli.main import app
from tibnlp.errors import ConfigError, DataError, TibnlpError
from tibnlp.tracking.testing import sqlite_store


def _fails(*args: str) -> BaseException:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code != 0 and isinstance(result.exception, TibnlpError), result.output
    return result.exception


def test_a_store_uri_of_the_wrong_kind_says_which_to_give(tmp_path: Path, monkeypatch) -> None:
    """`--tracking-uri mlflow.db` said "no tracking store at .../mlflow.db" beside that very
    file; `sqlite://` looked for a file named "sqlite:"; `sqlite:///:memory:` made an empty
    store and answered "no experiment"; `sqlite:///FOLDER` said there was no store."""
    monkeypatch.chdir(tmp_path)
    sqlite_store(tmp_path)
    exc = _fails("runs", "compare", "-e", "x", "--tracking-uri", "mlflow.db")
    assert "is a file" in str(exc) and f"sqlite:///{tmp_path}/mlflow.db" in str(exc.hint)
    for uri in ("sqlite://", "sqlite:///:memory:"):
        exc = _fails("runs", "compare", "-e", "x", "--tracking-uri", uri)
        assert "in-memory database" in str(exc)
    exc = _fails("runs", "compare", "-e", "x", "--tracking-uri", f"sqlite:///{tmp_path}")
    assert "not a SQLite file" in str(exc) and f"{tmp_path}/mlflow.db" in str(exc.hint)


def test_a_folder_store_says_how_to_read_it(tmp_path: Path, monkeypatch) -> None:
    """MLflow 3 refuses an mlruns folder; the hint said to point elsewhere, where the runs are
    not, instead of how to read (or migrate) the folder."""
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    exc = _fails("runs", "compare", "-e", "x", "--tracking-uri", f"file://{tmp_path}")
    assert isinstance(exc, ConfigError) and "MLFLOW_ALLOW_FILE_STORE=true" in str(exc.hint)
    assert f"migrate-filestore --source {tmp_path}" in str(exc.hint)


def test_a_deleted_experiment_is_named_as_deleted(tmp_path: Path) -> None:
    """A deleted experiment was reported as having no run with the metric."""
    uri = sqlite_store(tmp_path)
    client = MlflowClient(uri)
    exp = client.create_experiment("gone")
    client.delete_experiment(exp)
    for cmd in (["compare"], ["plot", "-o", str(tmp_path / "p.png")]):
        exc = _fails("runs", *cmd, "-e", "gone", "--tracking-uri", uri)
        assert "'gone'" in str(exc) and "is deleted" in str(exc)
        assert f"restore -x {exp}" in str(exc.hint)
    assert not (tmp_path / "p.png").exists()


def _buffer(folder: Path, uri: str, *lines: str) -> Path:
    """A buffer file as a tracker writes it: one run, finished."""
    local = "offline-" + "a" * 32
    recs = [
        {"op": "header", "uri": uri, "version": 1},
        {"op": "create_run", "local_id": local, "experiment": "e", "run_name": "r", "tags": {}},
        *lines,
        {"op": "set_terminated", "run": local, "status": "FINISHED", "time": 1},
    ]
    folder.mkdir()
    path = folder / "1-a.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in recs))
    return path


def test_runs_sync_reports_damaged_lines_and_replays_the_rest(tmp_path: Path) -> None:
    """A line that was JSON but no record (`42`) ended sync in an AttributeError traceback; a
    garbled line was skipped without a word, and the buffer removed as if all was sent."""
    uri = sqlite_store(tmp_path)
    run = "offline-" + "a" * 32
    metric = {
        "op": "log_batch",
        "run": run,
        "metrics": [["m", 1.0, 0, 1]],
        "params": [],
        "tags": [],
    }
    path = _buffer(
        tmp_path / "buf",
        uri,
        "42",
        '{"op": "log_batch", "metr',
        json.dumps({"op": "log_batch", "metrics": [], "params": [["a", "1"]], "tags": []}),
        json.dumps(metric),
    )
    result = CliRunner().invoke(app, ["runs", "sync", str(path)])
    # the damaged calls are not sent: exit 2, and they are kept to repair (test_qa_tracking.py)
    assert isinstance(result.exception, DataError), result.output  # the CLI's exit 2
    said = " ".join(result.output.split())
    assert "line 3 is no tracking record: '42'" in said
    assert "line 4 is no tracking record" in said
    assert "a log_batch record is damaged (KeyError('run'))" in said
    assert "replayed 3 buffered tracking calls" in said and not path.exists()
    client = MlflowClient(uri)
    (found,) = client.search_runs([client.get_experiment_by_name("e").experiment_id])
    assert found.data.metrics == {"m": 1.0} and found.info.status == "FINISHED"


def test_runs_sync_keeps_the_buffer_when_the_store_cannot_open(tmp_path: Path, monkeypatch) -> None:
    """A locked SQLite store (MLflow opens it in MlflowClient()) or a file that is no database
    ended sync in a traceback; locked now waits, a wrong store is a ConfigError."""
    import sqlalchemy.exc

    notes = tmp_path / "notes.txt"
    notes.write_text("not a database")
    path = _buffer(tmp_path / "buf", f"sqlite:///{notes}")
    text = path.read_text()
    exc = _fails("runs", "sync", str(path))
    assert isinstance(exc, ConfigError) and str(path) in str(exc) and "kept" in str(exc)
    assert "--tracking-uri" in str(exc.hint) and path.read_text() == text

    def locked(uri: str) -> None:
        raise sqlalchemy.exc.OperationalError("SELECT", {}, Exception("database is locked"))

    monkeypatch.setattr("tibnlp.tracking.sync.MlflowClient", locked)
    result = CliRunner().invoke(app, ["runs", "sync", str(path)])
    assert result.exit_code == 1, result.output
    said = " ".join(result.output.split())
    assert "1 buffer files left" in said and "database is locked" in said
    assert path.read_text() == text


def test_ui_refuses_a_missing_store_a_busy_port_and_a_bad_host(tmp_path: Path, monkeypatch) -> None:
    """A busy port failed after MLflow's slow start with "exited with code 0"; a bad host the
    same; `tibnlp ui` in the wrong folder made an empty ./mlflow.db and served it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    exc = _fails("ui")
    assert isinstance(exc, ConfigError) and f"{tmp_path}/mlflow.db" in str(exc)
    assert list(tmp_path.iterdir()) == []
    uri = sqlite_store(tmp_path)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        exc = _fails("ui", "--port", str(port), "--tracking-uri", uri)
    assert f"port {port}" in str(exc) and "already uses" in str(exc) and "--port" in str(exc.hint)
    exc = _fails("ui", "--host", "no-such-host.invalid", "--tracking-uri", uri)
    assert "--host 'no-such-host.invalid'" in str(exc)
    result = CliRunner().invoke(app, ["ui", "--port", "70000", "--tracking-uri", uri])
    assert result.exit_code == 2 and "--port" in result.output


def test_memory_text_shows_unknown_pieces_as_the_table_does(tmp_path: Path) -> None:
    """The table said [UNK] where the memory text said " ⁇ " (SentencePiece's stand-in), which
    reads as a character of the document; a certain token's entropy showed as -0.000."""
    from tests.test_memory import _model_dir
    from tibnlp.models.memory_report import inspect_memory

    model_dir, _ = _model_dir(tmp_path)
    text = tmp_path / "unk.txt"
    text.write_text("བོད་ཀྱི་ ABC སྐད་ཡིག\n", encoding="utf-8")
    report = inspect_memory(model_dir, text, threshold=float("inf"), budget=50, segment_len=16)
    assert "[UNK]" in [k.piece for k in report.kept]
    assert "⁇" not in report.memory_text and "བོད་ཀྱི་ [UNK] སྐད་ཡིག" in report.memory_text
    assert all(k.entropy >= 0 for k in report.kept) and report.mean_entropy >= 0


def test_an_empty_metric_pattern_is_a_usage_error(tmp_path: Path, monkeypatch) -> None:
    """`runs compare -m ''` ended in "no finished run ... has a metric matching " with nothing
    after it; an empty pattern is a mistake in the command, said as such."""
    from typer.testing import CliRunner

    from tibnlp.cli.main import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["runs", "compare", "-e", "x", "-m", ""])
    assert result.exit_code == 2, result.output
    assert "cannot be empty" in " ".join(result.output.split())


def test_a_record_appended_while_a_replay_holds_the_buffer_lands_in_its_new_file(
    tmp_path: Path,
) -> None:
    """A training appending while `runs sync` replays the same buffer (the outage message
    suggests doing so): the append waits for the replay's rewrite and lands in the file that
    replaced it, instead of in the old file, which the rewrite unlinks (a lost record)."""
    import threading

    from tibnlp.fsutil import atomic_write_text
    from tibnlp.tracking.buffer import Buffer, held, read_records

    path = tmp_path / "buf.jsonl"
    buffer = Buffer(path, "sqlite:///x.db")
    buffer.append({"op": "log_batch", "run": "r"})
    appended = threading.Event()

    def append_later() -> None:
        buffer.append({"op": "log_batch", "run": "late"})
        appended.set()

    with held(path, create=False) as fh:  # a replay: read, then rewrite what is left
        assert fh is not None
        writer = threading.Thread(target=append_later)
        writer.start()
        assert not appended.wait(0.5)  # the append waits for the replay
        kept = path.read_text(encoding="utf-8").splitlines()[:1]  # the header; record sent
        atomic_write_text(path, "".join(line + "\n" for line in kept))
    writer.join(10)
    assert appended.is_set()
    runs = [r.get("run") for r in read_records(path) if r["op"] != "header"]
    assert runs == ["late"]
    assert read_records(path)[0]["op"] == "header"
    with held(tmp_path / "none.jsonl", create=False) as none:  # nothing to replay
        assert none is None
