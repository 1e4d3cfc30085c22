"""SentencePiece's own log, read while it trains: the EM rounds it reports drive the progress
of `tibnlp vocab build`, and its error lines are still shown.

Its log goes to the C-level stderr (fd 2), which Python cannot hook, so `c_stderr` points fd 2
at a pipe that a thread reads. The unigram trainer shrinks its pieces by `shrinking_factor`
per round down to 1.1 x vocab_size, which gives the number of rounds left.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from tibnlp.stopping import saying_to

Progress = Callable[[str, int, int | None], None]
"""`progress(stage, done, total)`, stages in order: "units" (sentences counted for
vocab.whole_units), "reading" (sentences handed to SentencePiece, of the train split's),
"seeding" (SentencePiece normalises and finds seed pieces; no count), "training" (EM rounds
done, of those expected: total None until the first round), "evaluating"."""

# SentencePiece's log line: absl's `I0102 10:11:12.345 123 file.cc:9] msg` (0.2.1+) or
# `file.cc(9) LOG(INFO) msg`; the severity and the message
_LOG_RE = re.compile(
    r"^(?:([IWEF])\d{4} [\d:.]+\s+\d+ [^\]]*\] |\S+\(\d+\) LOG\(([A-Z])[A-Z]*\) )(.*)"
)
_EM_RE = re.compile(r"EM sub_iter=(\d+) size=(\d+)")


def _spec_default(name: str) -> Any:
    from sentencepiece import sentencepiece_model_pb2 as pb

    return getattr(pb.TrainerSpec(), name)  # type: ignore[attr-defined]


class TrainLog:
    """SentencePiece's log lines -> `progress` stages and EM rounds. Returns the lines to show:
    its errors (what minloglevel=2 showed before) and what came before its first line."""

    def __init__(self, progress: Progress, vocab_size: int) -> None:
        self.progress = progress
        self.target = int(vocab_size * 1.1)  # the unigram trainer's desired_vocab_size_
        self.shrink = float(_spec_default("shrinking_factor"))
        self.last_sub = int(_spec_default("num_sub_iterations")) - 1
        self.rounds = 0
        self.severity = "E"  # shown: until SentencePiece's first line, lines are not its

    def __call__(self, line: str) -> str | None:
        if match := _LOG_RE.match(line):
            self.severity = match.group(1) or match.group(2)
            self._note(match.group(3))
        elif line.startswith("WARNING: All log messages before absl::InitializeLog()"):
            return None
        return line if self.severity in "EF" else None  # other lines: the message's own

    def _note(self, message: str) -> None:
        if message.startswith("Normalizing sentences"):
            self.progress("seeding", 0, None)
        elif em := _EM_RE.search(message):
            sub, size = int(em.group(1)), int(em.group(2))
            if sub < self.last_sub:
                if not self.rounds:
                    self.progress("training", 0, None)
                return
            self.rounds += 1
            left = math.log(self.target / size) / math.log(self.shrink) if size > self.target else 0
            self.progress("training", self.rounds, self.rounds + math.ceil(left))

    def finish(self) -> None:
        if self.rounds:
            self.progress("training", self.rounds, self.rounds)


def _fileno(stream: Any) -> int | None:
    try:
        return int(getattr(stream, "rich_proxied_file", stream).fileno())
    except (AttributeError, OSError, ValueError):
        return None


@contextlib.contextmanager
def c_stderr(handle: Callable[[str], str | None]) -> Iterator[bool]:
    """The lines C code writes to stderr (fd 2: SentencePiece's log) go through `handle`, from
    a pipe a thread reads; what it returns is shown on the real stderr. Python's sys.stderr,
    when it is fd 2 (a progress bar), writes there meanwhile, not into the pipe. Yields False,
    capturing nothing, where fd 2 cannot be redirected."""
    try:
        read, write = os.pipe()
    except OSError:
        yield False
        return
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 at all
        os.close(read)
        os.close(write)
        yield False
        return
    with contextlib.suppress(ImportError, AttributeError, OSError):  # Linux: room for a burst
        import fcntl

        fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, 1 << 20)
    real = os.fdopen(saved, "w", encoding="utf-8", errors="replace", buffering=1)

    def pump() -> None:
        with os.fdopen(read, "rb") as lines:
            for raw in lines:  # always drained: a full pipe would stall SentencePiece
                text = raw.decode("utf-8", "replace").rstrip("\r\n")
                try:
                    shown = handle(text)
                except Exception:  # a progress display's failure never stalls the build
                    shown = text
                if shown is not None:
                    real.write(shown + "\n")

    reader = threading.Thread(target=pump, name="sentencepiece-log", daemon=True)
    reader.start()
    python_stderr = sys.stderr
    swap = _fileno(python_stderr) == 2
    with contextlib.suppress(Exception):
        python_stderr.flush()
    os.dup2(write, 2)
    os.close(write)
    if swap:
        sys.stderr = real
    try:
        with saying_to(saved):
            yield True
    finally:
        os.dup2(saved, 2)  # closes the pipe's last write end: the reader sees its end
        if swap:
            sys.stderr = python_stderr
        reader.join()
        real.close()
