"""A reader of stdout that stops early (`tibnlp predict ... | head -1`): the command stops
quietly with 141, as a Unix tool killed by SIGPIPE does, not exit 1 (typer's) or a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ft_fixtures import trained_textcnn
from tibnlp.cli.main import STDOUT_CLOSED, stdout_closed

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory) -> Path:
    return trained_textcnn(tmp_path_factory.mktemp("pipe"))


def test_predict_into_head_stops_quietly(classifier_dir: Path, tmp_path: Path) -> None:
    """`predict ... | head -1` exited 1: its output (far more than a pipe holds) met the
    reader gone after the first line."""
    src = tmp_path / "in.txt"
    src.write_text("སློབ གྲྭ དགེ རྒན\n" * 3000, "utf-8")
    args = ["predict", "--model", str(classifier_dir), "-i", str(src)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tibnlp", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = json.loads(proc.stdout.readline())
    proc.stdout.close()  # what `head -1` does after its line
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == STDOUT_CLOSED == 141, err
    assert first["line"] == 1 and "prediction" in first
    assert "Traceback" not in err and "Error" not in err, err


def test_any_command_with_its_reader_gone_stops_quietly() -> None:
    """The same for every command that writes to stdout (`model describe`'s tables here;
    `runs compare`'s csv, `--help`): the status is set once, in `cli.main`."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tibnlp", "model", "describe"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
            timeout=120,
        )
    finally:
        os.close(write)
    assert done.returncode == STDOUT_CLOSED, done.stderr
    assert "Traceback" not in done.stderr and "Error" not in done.stderr, done.stderr


def test_output_still_buffered_meets_the_closed_pipe_in_main(monkeypatch) -> None:
    """Output a command left in the buffer is flushed by `main`: a broken pipe then is the
    reader gone too, and stdout goes to /dev/null, so the interpreter's own last flush does
    not print "Exception ignored ... BrokenPipeError" and exit 120."""
    assert not stdout_closed(SystemExit(0))  # a working stdout: no change of status
    read, write = os.pipe()
    os.close(read)
    with os.fdopen(write, "w") as stream:
        stream.write("a line left in the buffer\n")
        monkeypatch.setattr(sys, "stdout", stream)
        assert stdout_closed(SystemExit(0))
        stream.write("more\n")
        stream.flush()  # to /dev/null now: nothing left to fail


def test_a_command_started_with_stdout_closed_is_not_broken_by_it() -> None:
    """Started with fd 1 closed (`tibnlp data list >&-`), Python has no sys.stdout: the
    check for a reader gone met None at every exit, a traceback and exit 1 for any command."""
    done = subprocess.run(
        ["bash", "-c", f'"{sys.executable}" -m tibnlp model describe >&-'],
        capture_output=True,
        text=True,
        env=ENV,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
