"""`tibnlp ui` serves the MLflow UI for the toolkit's store on loopback and stops cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tibnlp.tracking import Tracker
from tibnlp.tracking.server import free_port
from tibnlp.tracking.testing import sqlite_store

pytestmark = pytest.mark.slow


def test_ui_serves_the_store_on_loopback(tmp_path: Path) -> None:
    store = sqlite_store(tmp_path)
    with Tracker("seen-in-ui", "r", uri=store, buffer_dir=tmp_path / "buf") as tr:
        tr.log_metrics({"loss": 1.0}, step=1)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    cmd = [sys.executable, "-m", "tibnlp.cli.main", "ui", "--port", str(port)]
    proc = subprocess.Popen(
        [*cmd, "--tracking-uri", store],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()  # printed once the server answers
        assert line == f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(f"{line}/health", timeout=10) as resp:
            assert resp.status == 200
        api = f"{line}/api/2.0/mlflow/experiments/get-by-name?experiment_name=seen-in-ui"
        with urllib.request.urlopen(api, timeout=10) as resp:
            assert b"seen-in-ui" in resp.read()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the server went away with the command
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
        except OSError:
            break
        time.sleep(0.3)
    else:
        pytest.fail("mlflow server still answers after `tibnlp ui` stopped")
