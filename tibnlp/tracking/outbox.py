"""How a run's calls reach the store: sent now, or buffered while the store is away.

Tracking never kills training: when the store cannot be reached (at start or mid-run), every
call goes to a local JSONL buffer (see `buffer`), a warning is printed once, and the buffer is
replayed when the store answers again (probed every `retry_seconds`) or when the run ends.
What is still buffered then is replayed by `tibnlp runs sync`. `tracker.Tracker` decides
what a run logs; this module only carries its records.
"""

from __future__ import annotations

import logging
import math
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

from tibnlp.tracking.buffer import Buffer, IdMap, interrupted, is_outage
from tibnlp.tracking.replay import Applier, replay

log = logging.getLogger("tibnlp.tracking")
_WARNED: set[str] = set()  # stores already reported unreachable: warn once, not per run


class TrackingOutageWarning(UserWarning):
    """The tracking store is unreachable; calls are buffered locally."""


class Outbox:
    """One run's records on their way to the store at `uri`: applied now, or kept in `buffer`
    (whose folder, shared with the run's children, also holds `ids.json` and the staged
    copies of artifacts under files/) until the store answers again."""

    def __init__(
        self, uri: str, client: MlflowClient, ids: IdMap, buffer: Buffer, retry_seconds: float
    ) -> None:
        self.uri = uri
        self.buffer = buffer
        self.retry_seconds = retry_seconds
        self.applier = Applier(client, ids)
        self.folder = buffer.path.parent
        self.offline = False
        self._interrupted = False  # a Ctrl-C came back from the store: buffer, never retry
        # monotonic time starts near 0 at boot: "never tried" must be older than any probe
        # interval, or a machine up for less than retry_seconds never retries
        self._last_try = -math.inf

    def submit(self, rec: dict[str, Any]) -> None:
        """Send `rec`, or buffer it while the store is away; a rejection is logged, not
        raised (e.g. a param re-logged with another value); a Ctrl-C goes on."""
        if self.offline and not self._maybe_reconnect():
            self._keep(rec)
            return
        try:
            self.applier.apply(rec)
        except Exception as exc:
            if interrupted(exc):
                # the record is kept; the store is left alone from here (its interrupted
                # transaction may hold the file's lock), and the interrupt goes on
                self.offline = True
                self._interrupted = True
                self._keep(rec)
                raise KeyboardInterrupt from exc
            if is_outage(exc):
                self._go_offline(exc)
                self._keep(rec)
            else:  # the store said no (e.g. a param re-logged with another value)
                log.warning("tracking: %s rejected by the store: %s", rec["op"], exc)

    def close(self) -> None:
        """At the run's end: one last try to replay what is buffered, whatever the probe
        interval (else say where it is kept), and no empty staging folder left behind."""
        if self.offline:
            self._last_try = -math.inf
            if not self._maybe_reconnect():
                self._say_kept()
        staging = self.folder / "files"
        if staging.is_dir() and not any(staging.iterdir()):
            shutil.rmtree(staging, ignore_errors=True)

    def staged(self, name: str) -> Path:
        """A file path that outlives this call (the upload may be buffered until later)."""
        root = self.folder / "files"
        root.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix="staged-", dir=root))
        return folder / Path(name).name

    def _go_offline(self, exc: BaseException) -> None:
        self.offline = True
        self._last_try = time.monotonic()
        if self.uri not in _WARNED:
            _WARNED.add(self.uri)
            msg = (
                f"tracking store {self.uri} is unreachable ({type(exc).__name__}: "
                f"{str(exc)[:200]}); training continues and every tracking call is buffered "
                f"in {self.buffer.path}, replayed when the store answers again "
                f"(or later with `tibnlp runs sync {self.buffer.path}`)"
            )
            log.warning(msg)
            # the source line shown: the Tracker method that made the call
            warnings.warn(msg, TrackingOutageWarning, stacklevel=4)

    def _flush(self) -> bool:
        """Replay the buffer; True when it is empty afterwards."""
        if not self.buffer.path.exists():
            return True
        done = replay(self.buffer.path, self.applier)
        kept = f"kept in {done.unsent}" if done.unsent else "dropped"
        for why in done.refused:  # not retried, reported
            log.warning("tracking: the store rejected a buffered record: %s; %s", why, kept)
        for why in done.damaged:
            log.warning("tracking: %s: %s; %s", self.buffer.path, why, kept)
        for why in done.missing:
            log.warning("tracking: a buffered artifact's file is missing: %s; %s", why, kept)
        return not self.buffer.pending()

    def _maybe_reconnect(self) -> bool:
        if self._interrupted or time.monotonic() - self._last_try < self.retry_seconds:
            return False
        self._last_try = time.monotonic()
        if self._flush():
            self.offline = False
            _WARNED.discard(self.uri)
            log.warning("tracking store %s answers again; buffered calls replayed", self.uri)
            return True
        return False

    def _keep(self, rec: dict[str, Any]) -> None:
        """Buffer `rec`. An artifact is uploaded from its path only when the buffer is
        replayed, and by then a pipeline stage's partial folder has been renamed to its output
        (and a file may be rewritten): the upload was dropped ("no longer exists") and a model
        registered from it pointed at nothing. What is buffered is a copy, taken now.

        A copy's path is kept relative to the buffer's folder (`files/staged-X/NAME`): the
        folder is carried to a machine that reaches the store and synced there, where its
        absolute path named nothing and every artifact was dropped."""
        if rec.get("op") == "log_artifact" and not rec.get("staged"):
            source = Path(rec["path"])
            try:
                copy = self.staged(source.name)
                if source.is_dir():
                    shutil.copytree(source, copy)
                else:
                    shutil.copy2(source, copy)
            except OSError as exc:  # no room for a copy: the path itself, as before
                log.warning("tracking: %s is buffered without a copy (%s)", source, exc)
            else:
                rec = {**rec, "path": str(copy), "staged": True}
        if rec.get("staged"):
            home = self.folder.resolve()
            path = Path(rec["path"]).resolve()
            if path.is_relative_to(home):
                rec = {**rec, "path": path.relative_to(home).as_posix()}
        self.buffer.append(rec)

    def _say_kept(self) -> None:
        log.warning(
            "tracking store %s %s: %d calls kept in %s; replay them with `tibnlp runs sync %s`",
            self.uri,
            "left alone after an interrupt" if self._interrupted else "still unreachable",
            len(self.buffer),
            self.buffer.path,
            self.buffer.path,
        )
