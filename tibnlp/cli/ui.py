"""`tibnlp ui`: the MLflow UI on the toolkit's store, on loopback unless `--host` says so."""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from tibnlp.cli.common import console
from tibnlp.errors import TibnlpError
from tibnlp.stopping import Stopped, exit_status
from tibnlp.tracking import default_tracking_uri
from tibnlp.tracking.reading import read_client
from tibnlp.tracking.server import (
    check_listen,
    last_output,
    start_server,
    stop_server,
    wait_until_up,
)


def ui(
    host: Annotated[str, typer.Option(help="Interface; 0.0.0.0 exposes it to the network.")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port.")] = 5000,
    tracking_uri: Annotated[
        str, typer.Option("--tracking-uri", help="Store (default: as training uses).")
    ] = "",
) -> None:
    """Start the MLflow UI against the same store the stages log to; Ctrl-C stops it."""
    store = default_tracking_uri(tracking_uri)
    if not store.startswith(("http://", "https://")):  # (a server: start_server says so)
        # a UI on a store that is not there would create an empty one and show no runs; one
        # MLflow cannot open (not a database, an old schema) made its server exit unexplained
        read_client(tracking_uri)
    check_listen(host, port)
    # `kill`, systemd and `docker stop` send SIGTERM, a closed terminal SIGHUP: they leave
    # through the `finally` below like Ctrl-C does (the entry point's `stop_on_signals`), so
    # the server's whole process group is stopped. SIGINT too is set explicitly: a shell
    # starts background commands with it ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    code = 0
    # the server's output, read back when it stops by itself (removed when the UI ends)
    fd, name = tempfile.mkstemp(prefix="tibnlp-ui-", suffix=".log")
    os.close(fd)
    log = Path(name)
    try:
        proc = start_server(store, host=host, port=port, log_file=log)
        url = server_url(host, port)
        try:
            wait_until_up(url, proc, log_file=log)
            console.print(f"MLflow UI for {store}: [bold]{url}[/] (Ctrl-C stops it)")
            typer.echo(url)
            code = proc.wait()
            # only Ctrl-C or a signal to this command ends the UI: a server that stopped
            # by itself (a crash, killed) is not a success
            said = last_output(log)
            raise TibnlpError(
                f"the MLflow server for {store} stopped by itself (exit code {code})"
                + (f"; its last output:\n{said}" if said else ""),
                "start `tibnlp ui` again; if it stops again, its output above says why",
            )
        except KeyboardInterrupt as stop:  # Ctrl-C: 0; SIGTERM, SIGHUP: 128 + the signal
            code = exit_status(stop) if isinstance(stop, Stopped) else 0
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a second signal must
                signal.signal(sig, signal.SIG_IGN)  # not cut the shutdown short
            stop_server(proc)
    finally:
        log.unlink(missing_ok=True)
    if code:
        raise SystemExit(code)


def server_url(host: str, port: int) -> str:
    """Where a browser reaches the server: a wildcard host as loopback, IPv6 in brackets."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"
