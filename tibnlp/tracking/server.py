"""Start an MLflow server (the UI) against the toolkit's store, on loopback by default."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tibnlp.errors import TibnlpError
from tibnlp.tracking.tracker import default_tracking_uri


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def server_command(
    store_uri: str, host: str, port: int, artifacts: Path | None = None, workers: int = 1
) -> list[str]:
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", store_uri]
    cmd += ["--host", host, "--port", str(port), "--workers", str(workers)]
    if artifacts is not None:
        cmd += ["--artifacts-destination", str(artifacts)]
    return cmd


def start_server(
    store_uri: str = "",
    host: str = "127.0.0.1",
    port: int = 5000,
    artifacts: Path | None = None,
    log_file: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start `mlflow server` in its own process group (so `stop_server` ends all its workers)."""
    store = default_tracking_uri(store_uri)
    if store.startswith(("http://", "https://")):
        raise TibnlpError(
            f"the tracking store {store} is already a server",
            "open that address in a browser, or pass --tracking-uri sqlite:///mlflow.db",
        )
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL  # noqa: SIM115
    env = {**os.environ, "MLFLOW_TRACKING_URI": store}
    return subprocess.Popen(
        server_command(store, host, port, artifacts),
        stdout=out,
        stderr=subprocess.STDOUT if log_file else subprocess.DEVNULL,
        start_new_session=True,
        env=env,
    )


def wait_until_up(
    url: str, proc: subprocess.Popen[bytes] | None = None, timeout: float = 120
) -> None:
    """Poll `url/health` until the server answers; error out if the process died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise TibnlpError(
                f"mlflow server exited with code {proc.returncode} before answering",
                "is the port already in use? try --port",
            )
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise TibnlpError(f"mlflow server at {url} did not answer within {timeout:.0f}s")


def stop_server(proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    """Stop the server and its worker processes (its own process group only)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout)
    except ProcessLookupError:
        pass
