"""Start an MLflow server (the UI) against the toolkit's store, on loopback by default."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tibnlp.errors import TibnlpError
from tibnlp.stopping import die_with_parent
from tibnlp.tracking.store import default_tracking_uri


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def check_listen(host: str, port: int) -> None:
    """A TibnlpError naming the host or port when a server could not listen there: checked
    before starting MLflow, whose server exits (after a slow start) without saying why."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise TibnlpError(
            f"--host {host!r} is not an address or host name this machine resolves ({exc})",
            "use 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)",
        ) from exc
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            sock.bind(address)
        except OSError as exc:
            busy = exc.errno == errno.EADDRINUSE
            raise TibnlpError(
                f"cannot listen on {host} port {port}: "
                + ("another program already uses that port" if busy else exc.strerror or str(exc)),
                "pick a free port with --port" if busy else "use --host 127.0.0.1 or 0.0.0.0",
            ) from exc


def server_command(
    store_uri: str, host: str, port: int, artifacts: Path | None = None, workers: int = 1
) -> list[str]:
    cmd = [sys.executable, "-m", "tibnlp.tracking.supervise"]  # stops the group it leads
    cmd += [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", store_uri]
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
    """Start `mlflow server` in its own process group, so `stop_server` ends it with its
    uvicorn and job workers; it also receives SIGTERM should the starting process die."""
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
        preexec_fn=die_with_parent(),  # SIGTERM should the starting process die
    )


def last_output(log_file: Path | None, lines: int = 12) -> str:
    """The server's last lines of output (what it said as it failed), "" when none."""
    if log_file is None:
        return ""
    try:
        text = Path(log_file).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(line.rstrip() for line in text.strip().splitlines()[-lines:])


def wait_until_up(
    url: str,
    proc: subprocess.Popen[bytes] | None = None,
    timeout: float = 120,
    log_file: Path | None = None,
) -> None:
    """Poll `url/health` until the server answers; error out if the process died, with what
    it said last (`log_file`: where its output goes)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            said = last_output(log_file)
            raise TibnlpError(
                f"mlflow server exited with code {proc.returncode} before answering"
                + (f"; its last output:\n{said}" if said else ""),
                "is the port already in use? try --port"
                if not said
                else "fix what its output names (the store, the port), then start it again",
            )
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise TibnlpError(f"mlflow server at {url} did not answer within {timeout:.0f}s")


def group_alive(pgid: int) -> list[int]:
    """Pids of the live (non-zombie) processes of process group `pgid`."""
    proc = Path("/proc")
    if not proc.is_dir():  # no procfs: ask the kernel whether anything is left
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    alive = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        if fields[0] != "Z" and int(fields[2]) == pgid:
            alive.append(int(entry.name))
    return alive


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _wait_group(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc.poll()  # reap the leader
        if not group_alive(proc.pid):
            return True
        time.sleep(0.1)
    return False


def stop_server(proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    """Stop the server's whole process group (uvicorn, job runner, huey consumers), not only
    its first process; SIGKILL what is left after `timeout` seconds. Returns once none is left.
    """
    _signal_group(proc.pid, signal.SIGTERM)
    if not _wait_group(proc, timeout):
        _signal_group(proc.pid, signal.SIGKILL)
        _wait_group(proc, timeout)
    proc.poll()
