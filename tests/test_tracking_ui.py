"""`tibnlp ui` serves the MLflow UI for the toolkit's store on loopback and, however it ends,
takes the whole server with it: no process of the server's group survives, the port is free."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tibnlp.tracking import Tracker
from tibnlp.tracking.server import free_port, group_alive
from tibnlp.tracking.testing import sqlite_store

pytestmark = pytest.mark.slow


def _children(pid: int) -> list[int]:
    tasks = Path(f"/proc/{pid}/task")
    return [int(c) for t in tasks.iterdir() for c in (t / "children").read_text().split()]


def _port_free(port: int) -> bool:
    """Whether a new server could listen there: servers set SO_REUSEADDR, so connections
    the old one left in TIME_WAIT do not count."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _hangup_as_at_a_terminal() -> None:
    """The UI as started from a terminal: SIGHUP not ignored. Under `nohup` (a test run in
    the background) the UI inherits it ignored, and keeps ignoring it, as nohup asks."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _start_ui(store: str, port: int, log: Path) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    cmd = [sys.executable, "-m", "tibnlp.cli.main", "ui", "--port", str(port)]
    with log.open("w") as err:
        proc = subprocess.Popen(
            [*cmd, "--tracking-uri", store],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=env,
            preexec_fn=_hangup_as_at_a_terminal,
        )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()  # printed once the server answers
    assert line == f"http://127.0.0.1:{port}", log.read_text()
    return proc, line


def _has_workers(pgid: int, within: float = 60) -> bool:
    """A group with workers, not one process: the server starts its uvicorn and job workers
    after it answers, as fast as the machine lets it."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if len(group_alive(pgid)) > 1:
            return True
        time.sleep(0.2)
    return False


def _gone(pgid: int, port: int, within: float = 60) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not group_alive(pgid) and _port_free(port):
            return True
        time.sleep(0.3)
    return False


def test_ui_serves_the_store_on_loopback(tmp_path: Path) -> None:
    store = sqlite_store(tmp_path)
    with Tracker("seen-in-ui", "r", uri=store, buffer_dir=tmp_path / "buf") as tr:
        tr.log_metrics({"loss": 1.0}, step=1)
    port = free_port()
    proc, line = _start_ui(store, port, tmp_path / "ui.log")
    try:
        with urllib.request.urlopen(f"{line}/health", timeout=10) as resp:
            assert resp.status == 200
        api = f"{line}/api/2.0/mlflow/experiments/get-by-name?experiment_name=seen-in-ui"
        with urllib.request.urlopen(api, timeout=10) as resp:
            assert b"seen-in-ui" in resp.read()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL])
def test_ui_stops_its_whole_server_on_any_signal(tmp_path: Path, sig: signal.Signals) -> None:
    """SIGTERM is what `kill`, systemd and `docker stop` send; SIGKILL cannot be handled, the
    server then learns of it from the kernel (parent-death signal)."""
    port = free_port()
    proc, _ = _start_ui(sqlite_store(tmp_path), port, tmp_path / "ui.log")
    (server,) = _children(proc.pid)
    try:
        assert _has_workers(server), group_alive(server)
    finally:
        proc.send_signal(sig)
        proc.wait(timeout=90)
    assert _gone(server, port), f"after {sig.name}: {group_alive(server)} still running"


def test_the_printed_url_reaches_the_server() -> None:
    from tibnlp.cli.ui import server_url

    assert server_url("0.0.0.0", 5000) == "http://127.0.0.1:5000"
    assert server_url("::1", 5000) == "http://[::1]:5000"  # was http://::1:5000: no URL
    assert server_url("example.org", 80) == "http://example.org:80"
