"""`tibnlp runs compare` / `runs plot` on bad options: a clear error naming the option, no
store created by a command that only reads, no plot left behind by a failing command."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tibnlp.cli.main import app
from tibnlp.errors import ConfigError, TibnlpError
from tibnlp.tracking import Tracker
from tibnlp.tracking.testing import sqlite_store

HTTP_VARS = (
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
    "MLFLOW_HTTP_REQUEST_TIMEOUT",
)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Two seed runs of a fine-tuned pretrained model, in experiment `exp`."""
    folder = tmp_path_factory.mktemp("runs-inputs")
    uri = sqlite_store(folder)
    with Tracker("exp", "stage", uri=uri, buffer_dir=folder / "buf") as parent:
        for seed in (1, 2):
            with parent.child(f"seed {seed}") as run:
                run.log_params(
                    {
                        "finetune": {"head": "cnn", "model": "/m"},
                        "pretrain": {"tokens": 1000, "train_seconds": 36},
                    }
                )
                run.log_metrics({"test_macro_f1": 0.5 + seed / 100, "test_accuracy": 0.6})
    return uri


def _fails(*args: str) -> BaseException:
    result = CliRunner().invoke(app, ["runs", *args])
    assert result.exit_code != 0 and result.exception is not None, result.output
    return result.exception


def _plot(store: str, out: Path, *args: str) -> list[str]:
    return ["plot", "-e", "exp", "--part", "test", "-o", str(out), "--tracking-uri", store, *args]


@pytest.mark.parametrize("command", ["compare", "plot"])
def test_an_invalid_filter_names_the_option(store: str, tmp_path: Path, command: str) -> None:
    """Both commands raised MlflowException ("Invalid clause(s) in filter string")."""
    out = tmp_path / "p.png"
    base = ["compare", "-e", "exp", "--tracking-uri", store] if command == "compare" else None
    exc = _fails(*(base or _plot(store, out)), "--filter", "garbage ===")
    assert isinstance(exc, ConfigError) and "--filter 'garbage ==='" in str(exc)
    assert not out.exists()


def test_negative_digits_are_a_usage_error(store: str) -> None:
    """--digits -3 raised ValueError ("Format specifier missing precision")."""
    result = CliRunner().invoke(
        app, ["runs", "compare", "-e", "exp", "--tracking-uri", store, "--digits", "-3"]
    )
    assert result.exit_code == 2 and "--digits" in result.output


def test_a_store_uri_mlflow_cannot_read_names_it(tmp_path: Path) -> None:
    """bogus://x raised UnsupportedModelRegistryStoreURIException, a plain folder (MLflow's
    retired file store) MlflowException, a text file sqlalchemy's DatabaseError."""
    text = tmp_path / "notes.txt"
    text.write_text("not a database")
    for uri in ("bogus://x", str(tmp_path), f"sqlite:///{text}"):
        exc = _fails("compare", "-e", "exp", "--tracking-uri", uri)
        assert isinstance(exc, ConfigError) and uri in str(exc), exc
        assert "--tracking-uri" in str(exc)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_a_read_command_creates_no_store(tmp_path: Path, monkeypatch) -> None:
    """`sqlite:///nonexist/x.db` made nonexist/x.db, and compare in an empty folder made
    ./mlflow.db, then reported "no experiment" from the store it had just made."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    exc = _fails("compare", "-e", "exp", "--tracking-uri", "sqlite:///nonexist/x.db")
    assert isinstance(exc, ConfigError) and f"{tmp_path}/nonexist/x.db" in str(exc)
    exc = _fails("compare", "-e", "exp")
    assert isinstance(exc, ConfigError) and f"{tmp_path}/mlflow.db" in str(exc)
    assert "sqlite:///mlflow.db, the default" in str(exc)
    exc = _fails(*_plot("sqlite:///nonexist/x.db", tmp_path / "p.png"))
    assert isinstance(exc, ConfigError) and "nonexist/x.db" in str(exc)
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_group_key_is_refused(store: str) -> None:
    """-g nope put every run in one blank group, as if grouped."""
    for option, key, what in (("-g", "nope", "param"), ("--columns-by", "tag:nope", "tag")):
        exc = _fails("compare", "-e", "exp", "--tracking-uri", store, option, key)
        assert isinstance(exc, ConfigError), exc
        assert f"'{key}': no run compared carries this {what}" in str(exc)
        assert "finetune.head" in str(exc.hint)  # the params it could have named
    result = CliRunner().invoke(
        app, ["runs", "compare", "-e", "exp", "--tracking-uri", store, "-g", "finetune.head"]
    )
    assert result.exit_code == 0 and "cnn" in result.output


def test_a_plot_for_an_unknown_run_or_not_a_png_writes_nothing(store: str, tmp_path: Path) -> None:
    """--run-id deadbeef wrote the PNG, then failed; -o x.txt wrote a PNG named x.txt."""
    exc = _fails(*_plot(store, tmp_path / "plot7.png", "--run-id", "deadbeef"))
    assert isinstance(exc, TibnlpError) and "'deadbeef'" in str(exc)
    exc = _fails(*_plot(store, tmp_path / "x.txt"))
    assert isinstance(exc, ConfigError) and "x.txt" in str(exc) and ".png" in str(exc.hint)
    assert list(tmp_path.iterdir()) == []
    result = CliRunner().invoke(app, ["runs", *_plot(store, tmp_path / "ok.PNG")])
    assert result.exit_code == 0, result.output
    assert [p.name for p in tmp_path.iterdir()] == ["ok.PNG"]


def test_a_server_that_does_not_answer_fails_in_seconds(monkeypatch) -> None:
    """MLflow's default retries kept `runs compare` waiting over two minutes."""
    for name in HTTP_VARS:  # as a user's shell has them: unset (restored after the test)
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    start = time.monotonic()
    exc = _fails("compare", "-e", "exp", "--tracking-uri", f"http://127.0.0.1:{port}")
    assert isinstance(exc, ConfigError) and f"http://127.0.0.1:{port}" in str(exc)
    assert time.monotonic() - start < 30
