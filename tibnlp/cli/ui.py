"""`tibnlp ui`: the MLflow UI on the toolkit's store, on loopback unless `--host` says so."""

from __future__ import annotations

import signal
from types import FrameType
from typing import Annotated

import typer

from tibnlp.cli.common import console
from tibnlp.tracking import default_tracking_uri
from tibnlp.tracking.reading import require_existing_store, uri_origin
from tibnlp.tracking.server import check_listen, start_server, stop_server, wait_until_up


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
    # a UI on a store that is not there would create an empty one and show no runs
    require_existing_store(store, uri_origin(tracking_uri))
    check_listen(host, port)
    # `kill`, systemd and `docker stop` send SIGTERM, a closed terminal SIGHUP: leave through
    # the `finally` below like Ctrl-C does, so the server's whole process group is stopped.
    # SIGINT too is set explicitly: a shell starts background commands with it ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on_signal)
    proc = start_server(store, host=host, port=port)
    url = server_url(host, port)
    try:
        wait_until_up(url, proc)
        console.print(f"MLflow UI for {store}: [bold]{url}[/] (Ctrl-C stops it)")
        typer.echo(url)
        proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a second signal must
            signal.signal(sig, signal.SIG_IGN)  # not cut the shutdown short
        stop_server(proc)


def _exit_on_signal(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def server_url(host: str, port: int) -> str:
    """Where a browser reaches the server: a wildcard host as loopback, IPv6 in brackets."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"
