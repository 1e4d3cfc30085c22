"""Runs a killed pipeline or standalone pretraining left RUNNING, ended by the next run in
its folder (the pipeline's work dir, the pretraining's output).

A process killed with SIGKILL (the OOM killer, a scheduler's hard limit, a lost node) ends
no MLflow run: its parent run and the stage runs it had open stay RUNNING in the UI for good,
beside the runs that finished, and nothing says they are dead. Ctrl-C, SIGTERM and SIGHUP end
them already, KILLED or FAILED (`tibnlp.stopping`); this is for what no handler sees.

While it runs it keeps a ledger in its folder naming its (parent) run and store; a clean
end removes it. A run that finds a ledger holds the folder's lock (`tibnlp.folder_lock`), so
the process that wrote it is gone: that run, and every run under it still RUNNING, is ended
KILLED, and the run says so on the console. A run that resumes (the interrupted stage from
its partial output, `tibnlp pretrain --resume` from its checkpoint) marks it RUNNING again.
A ledger can note several runs: one whose store did not answer stays noted beside the run
now open, and each run removes only its own entry when it ends. A store that answers but
refuses to end a run (`GIVE_UP_AFTER` runs in a row) has it dropped, with a note saying how
to end it by hand: such an error lasts, and repeating it on every run says nothing new. A
store that does not answer is asked again each run: servers come back. A run created while the
store was unreachable (an offline id, `tibnlp runs sync`) is noted by no ledger.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from tibnlp.fsutil import atomic_write_text
from tibnlp.tracking.buffer import OFFLINE_ID, sqlite_file
from tibnlp.tracking.store import absolute_store, short_http_retries

LEDGER = ".tibnlp-open-run.json"
GIVE_UP_AFTER = 3  # runs in a row the store refused to end a noted run in: dropped then
# MLflow's error codes for a tracking server that did not answer or failed on its side
PASSING_ERRORS = ("INTERNAL_ERROR", "TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED")

Noted = dict[str, Any]  # {"run_id", "uri"} and "refused", the refusals so far


def _read(ledger: Path) -> list[Noted] | None:
    """The runs a ledger notes ({"runs": [{"run_id", "uri", "refused"}, ...]}; an older
    one-run ledger, {"run_id", "uri"}, reads as one), [] without a ledger, None when it cannot
    be read."""
    if not ledger.is_file():
        return []
    try:
        noted = json.loads(ledger.read_text(encoding="utf-8"))
        runs = noted.get("runs", [noted])
        return [
            {"run_id": str(r["run_id"]), "uri": str(r["uri"]), "refused": int(r.get("refused", 0))}
            for r in runs
        ]
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError, OSError):
        return None


def _write(ledger: Path, runs: list[Noted]) -> None:
    if runs:
        atomic_write_text(ledger, json.dumps({"runs": runs}) + "\n")
    else:
        ledger.unlink(missing_ok=True)


def open_run(folder: Path, run_id: str | None, uri: str) -> None:
    """Note the run this process has open in `folder`, beside any a dead process left that
    could not be ended yet (nothing for a run the store has not named yet: an offline id is
    the buffer's business, `tibnlp runs sync`)."""
    if run_id and not OFFLINE_ID.fullmatch(run_id):
        runs = [r for r in _read(folder / LEDGER) or [] if r["run_id"] != run_id]
        runs.append({"run_id": run_id, "uri": absolute_store(uri)})  # (from any directory)
        _write(folder / LEDGER, runs)


def close_run(folder: Path, run_id: str | None) -> None:
    """The run `run_id` noted in `folder` ended as it should (the others noted stay). Called
    while an error may be on its way out: a ledger it cannot rewrite (a full disk) is said,
    not raised over that error."""
    runs = _read(folder / LEDGER)
    if runs is None or not run_id:
        return
    try:
        _write(folder / LEDGER, [r for r in runs if r["run_id"] != run_id])
    except OSError as exc:
        print(f"note: could not update {folder / LEDGER} ({exc})", file=sys.stderr)


def end_orphans(folder: Path, echo: Callable[[str], None] = print) -> list[str]:
    """End the runs dead processes left open in `folder` (call with the folder's lock held),
    and their descendants still RUNNING; their ids, each parent first. A run whose store
    cannot be reached stays noted for the next run; an unreadable ledger is dropped with a
    note."""
    ledger = folder / LEDGER
    runs = _read(ledger)
    if runs is None:
        echo(f"note: {ledger} is unreadable; removed (a run it named may still read RUNNING)")
        ledger.unlink(missing_ok=True)
        return []
    kept: list[Noted] = []
    ended: list[str] = []
    down: set[str] = set()  # a store that did not answer is not asked again for this run
    for noted in runs:
        run_id, uri = noted["run_id"], noted["uri"]
        if uri in down:
            kept.append(noted)
            continue
        why, error = _end_noted(run_id, uri, ended)
        if why == "down":
            echo(
                f"note: could not reach {uri} to end the killed run {run_id} ({error}); "
                f"kept in {ledger}"
            )
            kept.append(noted)
            down.add(uri)
        elif why == "refused":
            noted["refused"] += 1
            if noted["refused"] < GIVE_UP_AFTER:
                echo(
                    f"note: could not end the killed run {run_id} in {uri} ({error}); "
                    f"kept in {ledger}"
                )
                kept.append(noted)
            else:
                echo(
                    f"note: could not end the killed run {run_id} in {uri} ({error}), "
                    f"{noted['refused']} runs in a row; no longer noted in {ledger}. End it "
                    f"by hand: MlflowClient({uri!r}).set_terminated({run_id!r}, 'KILLED')"
                )
    _write(ledger, kept)
    if ended:
        echo(
            f"note: a run in {folder} was killed before it could end its MLflow runs; "
            f"{len(ended)} marked KILLED ({', '.join(ended)})"
        )
    return ended


def _end_noted(run_id: str, uri: str, ended: list[str]) -> tuple[str, str]:
    """End one noted run and its RUNNING descendants into `ended`. ("", "") when it is done
    with (ended, or nothing left to end); ("refused", the error) when the store answered
    with an error that will last; ("down", the error) when it did not answer, or failed in
    a way that passes."""
    store = sqlite_file(uri)
    if store is not None and not store.is_file():
        return "", ""  # the store is gone: opening it would make an empty one
    short_http_retries(uri)  # a server that is down answers in seconds, not minutes
    try:
        ended += _end_tree(MlflowClient(uri), run_id)
    except MlflowException as exc:
        code = str(getattr(exc, "error_code", ""))
        if "RESOURCE_DOES_NOT_EXIST" in code:
            return "", ""  # deleted from the store since: nothing to end
        return ("down" if _passing(uri, code, exc) else "refused"), str(exc)
    except Exception as exc:  # an unreachable store: try again next time
        return "down", str(exc)
    return "", ""


def _passing(uri: str, code: str, exc: Exception) -> bool:
    """Whether a store's error may be gone by the next run. A server's: MLflow's client
    retries what passes (timeouts, 429, 5xx, a refused connection) and then says
    INTERNAL_ERROR; a 401, 403 or 404 has a code of its own. A local store's: only a locked
    database passes; MLflow turns every database error into TEMPORARILY_UNAVAILABLE, a
    read-only file included, and a local failure is INTERNAL_ERROR too."""
    if uri.startswith(("http://", "https://")):
        return code in PASSING_ERRORS
    return "database is locked" in str(exc)


def _end_tree(client: MlflowClient, run_id: str) -> list[str]:
    run = client.get_run(run_id)
    ended = []
    # a run deleted in the UI cannot be ended (the store refuses): it is out of sight anyway
    if run.info.status == "RUNNING" and run.info.lifecycle_stage != "deleted":
        client.set_terminated(run_id, "KILLED")
        ended.append(run_id)
    children = client.search_runs(
        [run.info.experiment_id], f"tags.mlflow.parentRunId = '{run_id}'", max_results=10_000
    )
    for child in children:
        if child.info.status == "RUNNING":
            ended += _end_tree(client, child.info.run_id)
    return ended
