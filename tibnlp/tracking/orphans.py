"""Runs a killed pipeline or standalone pretraining left RUNNING, ended by the next run in
its folder (the pipeline's work dir, the pretraining's output).

A process killed with SIGKILL (the OOM killer, a scheduler's hard limit, a lost node) ends
no MLflow run: its parent run and the stage runs it had open stay RUNNING in the UI for good,
beside the runs that finished, and nothing says they are dead. Ctrl-C, SIGTERM and SIGHUP end
them KILLED already (`tibnlp.cli.ui`); this is for what no handler sees.

While it runs it keeps a ledger in its folder naming its (parent) run and store; a clean
end removes it. A run that finds a ledger holds the folder's lock (`tibnlp.folder_lock`), so
the process that wrote it is gone: that run, and every run under it still RUNNING, is ended
KILLED, and the run says so on the console. A run that resumes (the interrupted stage from
its partial output, `tibnlp pretrain --resume` from its checkpoint) marks it RUNNING again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from tibnlp.fsutil import atomic_write_text
from tibnlp.tracking.buffer import OFFLINE_ID, sqlite_file
from tibnlp.tracking.tracker import absolute_store

LEDGER = ".tibnlp-open-run.json"


def open_run(folder: Path, run_id: str | None, uri: str) -> None:
    """Note the run this process has open in `folder` (nothing for a run the store has not
    named yet: an offline id is the buffer's business, `tibnlp runs sync`)."""
    if run_id and not OFFLINE_ID.fullmatch(run_id):
        noted = {"run_id": run_id, "uri": absolute_store(uri)}  # found from any directory
        atomic_write_text(folder / LEDGER, json.dumps(noted) + "\n")


def close_run(folder: Path) -> None:
    """The run noted in `folder` ended as it should."""
    (folder / LEDGER).unlink(missing_ok=True)


def end_orphans(folder: Path, echo: Callable[[str], None] = print) -> list[str]:
    """End the run a dead process left open in `folder` (call with the folder's lock held),
    and its descendants still RUNNING; their ids, parent first. A store that cannot be reached
    keeps the ledger for the next run; an unreadable ledger is dropped with a note."""
    ledger = folder / LEDGER
    if not ledger.is_file():
        return []
    try:
        noted = json.loads(ledger.read_text(encoding="utf-8"))
        run_id, uri = str(noted["run_id"]), str(noted["uri"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        echo(f"note: {ledger} is unreadable; removed (a run it named may still read RUNNING)")
        ledger.unlink(missing_ok=True)
        return []
    store = sqlite_file(uri)
    if store is not None and not store.is_file():
        ledger.unlink(missing_ok=True)  # the store is gone: opening it would make an empty one
        return []
    try:
        ended = _end_tree(MlflowClient(uri), run_id)
    except MlflowException as exc:
        if "RESOURCE_DOES_NOT_EXIST" in str(getattr(exc, "error_code", "")):
            ledger.unlink(missing_ok=True)  # deleted from the store since: nothing to end
            return []
        echo(f"note: could not end the killed run {run_id} in {uri} ({exc}); kept {ledger}")
        return []
    except Exception as exc:  # an unreachable store: try again next time
        echo(f"note: could not reach {uri} to end the killed run {run_id} ({exc}); kept {ledger}")
        return []
    ledger.unlink(missing_ok=True)
    if ended:
        echo(
            f"note: the last run in {folder} ({run_id}) was killed before it could end its "
            f"MLflow runs; {len(ended)} marked KILLED"
        )
    return ended


def _end_tree(client: MlflowClient, run_id: str) -> list[str]:
    run = client.get_run(run_id)
    ended = []
    if run.info.status == "RUNNING":
        client.set_terminated(run_id, "KILLED")
        ended.append(run_id)
    children = client.search_runs(
        [run.info.experiment_id], f"tags.mlflow.parentRunId = '{run_id}'", max_results=10_000
    )
    for child in children:
        if child.info.status == "RUNNING":
            ended += _end_tree(client, child.info.run_id)
    return ended
