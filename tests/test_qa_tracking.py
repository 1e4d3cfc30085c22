"""The tracking side as a demanding user meets it: `tibnlp runs sync` whose exit status says
whether every buffered call arrived, `runs compare --format csv --percent`, and `tibnlp ui` on a
store MLflow cannot open or a server that stops by itself."""

from __future__ import annotations

import csv
import io
import json
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from tibnlp.cli.main import app
from tibnlp.errors import ConfigError, DataError, TibnlpError
from tibnlp.tracking import Tracker
from tibnlp.tracking.testing import sqlite_store

RUN = "offline-" + "a" * 32


def _record(op: str, **fields: object) -> dict:
    base: dict = {"op": op, "run": RUN}
    if op == "log_batch":
        base |= {"metrics": [], "params": [], "tags": []}
    return base | fields


def _buffer(folder: Path, header: dict, *lines: object, torn: str = "") -> Path:
    """A buffer file as a tracker writes it (one run, created first and finished last), with
    `lines` between: records, or raw text (a damaged line); `torn`: a last line cut short."""
    recs = [
        header,
        {"op": "create_run", "local_id": RUN, "experiment": "e", "run_name": "r", "tags": {}},
        *lines,
        {"op": "set_terminated", "run": RUN, "status": "FINISHED", "time": 1},
    ]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "1-a.jsonl"
    text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in recs)
    path.write_text(text + torn, encoding="utf-8")
    return path


def _sync(*args: str) -> tuple[int, str, BaseException | None]:
    result = CliRunner().invoke(app, ["runs", "sync", *args])
    code = result.exception.exit_code if isinstance(result.exception, TibnlpError) else None
    return code or result.exit_code, " ".join(result.output.split()), result.exception


def _the_run(uri: str):
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("e").experiment_id])
    return run


def test_sync_with_damaged_lines_exits_non_zero_and_keeps_them_to_repair(tmp_path: Path) -> None:
    """Lines dropped as damaged (a garbled line, a last line cut short by a crash) left
    `runs sync` at exit 0, the buffer removed with them: a script could not tell. Now the good
    calls are replayed, the command fails (exit 2) naming the lines and where they are kept,
    and the kept file, once repaired, syncs by name."""
    uri = sqlite_store(tmp_path)
    metric = _record("log_batch", metrics=[["m", 1.0, 0, 1]])
    path = _buffer(
        tmp_path / "buf",
        {"op": "header", "uri": uri, "version": 1},
        "42",
        metric,
        torn='{"op": "log_batch", "ru',
    )
    code, said, exc = _sync(str(path))
    assert code == 2 and isinstance(exc, DataError), said
    assert "replayed 3 buffered tracking calls" in said  # the good lines still went
    assert "1-a.jsonl: line 3 is no tracking record: '42'" in said
    assert "1-a.jsonl: line 6 is cut short" in said
    unsent = path.with_name("1-a.jsonl.unsent")
    assert "2 buffered tracking call(s) could not be sent" in str(exc)
    assert str(unsent) in str(exc) and f"tibnlp runs sync {unsent}" in str(exc.hint)
    run = _the_run(uri)
    assert run.data.metrics == {"m": 1.0} and run.info.status == "FINISHED"
    assert not path.exists()
    kept = unsent.read_text(encoding="utf-8").splitlines()
    assert json.loads(kept[0])["uri"] == uri  # a buffer: it syncs by name once repaired
    assert kept[1:] == ["42", '{"op": "log_batch", "ru']

    # a folder sync does not take the kept file up again (nothing else to send: exit 0)
    assert _sync(str(path.parent))[0] == 0 and unsent.exists()

    # repaired: the run id created offline resolves through the folder's ids.json
    repaired = [kept[0], json.dumps(_record("log_batch", metrics=[["n", 2.0, 0, 1]]))]
    unsent.write_text("\n".join(repaired) + "\n", encoding="utf-8")
    code, said, _ = _sync(str(unsent))
    assert code == 0 and "replayed 1 buffered tracking calls" in said, said
    assert _the_run(uri).data.metrics == {"m": 1.0, "n": 2.0} and not unsent.exists()


def test_a_kept_file_synced_again_unrepaired_keeps_its_lines(tmp_path: Path) -> None:
    """Syncing the `.unsent` file as it is fails again and keeps the lines in that same file
    (no `.unsent.unsent`), while its good lines are sent."""
    uri = sqlite_store(tmp_path)
    header = {"op": "header", "uri": uri, "version": 1}
    path = _buffer(tmp_path / "buf", header, "not json")
    assert _sync(str(path))[0] == 2
    unsent = path.with_name(path.name + ".unsent")
    with unsent.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(_record("log_batch", params=[["p", "1"]])) + "\n")
    code, said, _ = _sync(str(unsent))
    assert code == 2 and "replayed 1 buffered tracking calls" in said, said
    assert sorted(p.name for p in unsent.parent.glob("1-a*")) == [unsent.name]
    assert unsent.read_text(encoding="utf-8").splitlines()[1:] == ["not json"]
    assert _the_run(uri).data.params == {"p": "1"}


def test_sync_of_a_call_the_store_refuses_exits_non_zero(tmp_path: Path) -> None:
    """A call the store refused (a param logged again with another value) was dropped and
    `runs sync` still exited 0."""
    uri = sqlite_store(tmp_path)
    header = {"op": "header", "uri": uri, "version": 1}
    first = _record("log_batch", params=[["lr", "0.1"]])
    again = _record("log_batch", params=[["lr", "0.2"]])
    path = _buffer(tmp_path / "buf", header, first, again)
    code, said, exc = _sync(str(path))
    assert code == 2 and isinstance(exc, DataError), said
    assert "not sent, the store refused it: 1-a.jsonl: log_batch" in said
    assert "replayed 3 buffered tracking calls" in said
    (kept,) = path.parent.glob("*.unsent")
    assert json.loads(kept.read_text().splitlines()[1])["params"] == [["lr", "0.2"]]
    run = _the_run(uri)
    assert run.data.params == {"lr": "0.1"} and run.info.status == "FINISHED"


def test_sync_of_a_buffer_whose_header_names_no_store(tmp_path: Path, monkeypatch) -> None:
    """A header without its store ended `runs sync` in KeyError('uri'); one whose store was
    null replayed into whatever the default store was. Now: an error naming the file and its
    line 1, nothing replayed; --tracking-uri sends it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for header in ({"op": "header", "version": 1}, {"op": "header", "uri": None}):
        path = _buffer(tmp_path / "buf", header, _record("log_batch", params=[["a", "1"]]))
        text = path.read_text()
        code, said, exc = _sync(str(path))
        assert code == 2 and isinstance(exc, DataError), said
        assert str(path) in str(exc) and "line 1" in str(exc) and "--tracking-uri" in str(exc.hint)
        assert path.read_text() == text and not (tmp_path / "mlflow.db").exists()
    uri = sqlite_store(tmp_path / "store")
    code, said, _ = _sync(str(path), "--tracking-uri", uri)
    assert code == 0, said
    assert _the_run(uri).data.params == {"a": "1"}


def test_compare_csv_obeys_percent(tmp_path: Path) -> None:
    """`--percent` ("Show values x100") was ignored by `--format csv`: a script asking for
    percentages read 0.55 beside a markdown table saying 55.00."""
    uri = sqlite_store(tmp_path)
    with Tracker("x", "p", uri=uri, buffer_dir=tmp_path / "b") as parent:
        for seed, f1 in ((1, 0.5), (2, 0.6)):
            with parent.child(f"seed {seed}", tags={"seed": str(seed)}) as run:
                run.log_metrics({"test_macro_f1": f1})
    args = ["runs", "compare", "-e", "x", "--tracking-uri", uri, "-f", "csv"]
    rows = {}
    for extra in ([], ["--percent"]):
        result = CliRunner().invoke(app, args + extra)
        assert result.exit_code == 0, result.output
        (rows[bool(extra)],) = csv.DictReader(io.StringIO(result.output))
    assert float(rows[False]["test_macro_f1 mean"]) == pytest.approx(0.55)
    assert float(rows[True]["test_macro_f1 mean"]) == pytest.approx(55.0)
    assert float(rows[True]["test_macro_f1 std"]) == pytest.approx(100 * 0.0707107, rel=1e-5)
    assert rows[True]["runs max"] == "2"  # counts are not scaled


@pytest.fixture
def own_signals() -> Iterator[None]:
    """`tibnlp ui` sets the process's signal handlers: give pytest its own back."""
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    saved = {s: signal.getsignal(s) for s in sigs}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def _fake_server(monkeypatch, tmp_path: Path, script: str) -> None:
    """`mlflow server` replaced by a short Python script (started as the real one is); temp
    files in tmp_path/tmp."""
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setattr(
        "tibnlp.tracking.server.server_command", lambda *a, **k: [sys.executable, "-c", script]
    )


def test_ui_on_a_file_that_is_no_store_says_so(tmp_path: Path, monkeypatch, own_signals) -> None:
    """`tibnlp ui` on a file that is no MLflow database started the server anyway, which died:
    "mlflow server exited with code 1 before answering", hint "is the port already in use?"
    (the port was free). Now the store is read first, as `runs compare` does."""
    notes = tmp_path / "notes.txt"
    notes.write_text("not a database")

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("no server is started for a store that cannot be read")

    monkeypatch.setattr("tibnlp.cli.ui.start_server", never)
    result = CliRunner().invoke(app, ["ui", "--tracking-uri", f"sqlite:///{notes}", "--port", "1"])
    assert isinstance(result.exception, ConfigError), result.output
    assert "is not an MLflow database" in str(result.exception)
    assert "port" not in str(result.exception.hint)


def test_ui_says_what_the_server_said_when_it_dies_at_start(
    tmp_path: Path, monkeypatch, own_signals
) -> None:
    """The server's output went nowhere: a server that failed at start was reported as
    "exited with code 1" with a guess about the port. Its last words are shown now."""
    uri = sqlite_store(tmp_path)
    _fake_server(
        monkeypatch, tmp_path, "import sys; print('Detected out-of-date database schema'); exit(1)"
    )
    from tibnlp.tracking.server import free_port

    result = CliRunner().invoke(app, ["ui", "--tracking-uri", uri, "--port", str(free_port())])
    assert isinstance(result.exception, TibnlpError), result.output
    assert "exited with code 1" in str(result.exception)
    assert "Detected out-of-date database schema" in str(result.exception)
    assert list((tmp_path / "tmp").iterdir()) == []  # its output file is removed


def test_ui_whose_server_stops_by_itself_fails(tmp_path: Path, monkeypatch, own_signals) -> None:
    """Once up, a server that stopped by itself (crashed, killed) ended `tibnlp ui` with exit
    0, as if the user had stopped it; now it is an error with the server's last output."""
    uri = sqlite_store(tmp_path)
    _fake_server(monkeypatch, tmp_path, "print('worker crashed: out of memory')")
    monkeypatch.setattr("tibnlp.cli.ui.wait_until_up", lambda *a, **k: None)  # "answered"
    from tibnlp.tracking.server import free_port

    result = CliRunner().invoke(app, ["ui", "--tracking-uri", uri, "--port", str(free_port())])
    assert isinstance(result.exception, TibnlpError), result.output
    assert "stopped by itself (exit code 0)" in str(result.exception)
    assert "worker crashed: out of memory" in str(result.exception)
    assert list((tmp_path / "tmp").iterdir()) == []


def test_sync_into_a_store_file_that_is_not_there_is_refused(tmp_path: Path) -> None:
    """A mistyped --tracking-uri sqlite path made a new empty store and replayed into it: the
    runs seemed lost from the store the user meant."""
    uri = sqlite_store(tmp_path)
    path = _buffer(tmp_path / "buf", {"op": "header", "uri": uri, "version": 1})
    typo = tmp_path / "mlfow.db"
    code, said, exc = _sync(str(path), "--tracking-uri", f"sqlite:///{typo}")
    assert code == 2 and isinstance(exc, DataError) and "no store at" in str(exc)
    assert not typo.exists() and path.exists()  # nothing made, nothing replayed
    typo.touch()  # a new store, on purpose
    code, said, exc = _sync(str(path), "--tracking-uri", f"sqlite:///{typo}")
    assert code == 0, said
    assert _the_run(f"sqlite:///{typo}").info.status == "FINISHED"
