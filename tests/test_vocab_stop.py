"""Ctrl-C during `tibnlp vocab build`'s SentencePiece training: one C call of minutes on a large
corpus, in which Python's SIGINT handler cannot run. It did nothing until the call returned
(SIGTERM was taken within `stopping.TAKE_S`); now Ctrl-C is taken the same way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# `_train` with SentencePiece's training replaced by one endless C call that releases the GIL,
# as SentencePiece's does; "training" is printed once the sentences are read
SCRIPT = """
import hashlib, signal, sys
from pathlib import Path
import sentencepiece as spm
from tibnlp import stopping
from tibnlp.config import VocabConfig
from tibnlp.text import vocab_build

def endless_training(sentence_iterator, **_):
    for _ in sentence_iterator:
        pass
    print("training", flush=True)
    hashlib.pbkdf2_hmac("sha256", b"x", b"y", 2**31 - 1)

signal.signal(signal.SIGINT, signal.default_int_handler)  # (as in a terminal's foreground)
spm.SentencePieceTrainer.train = endless_training
stopping.stop_on_signals()  # as the CLI does
vocab_build._train(VocabConfig(vocab_size=200, num_threads=1), ["ཀ་ཁ།"], Path(sys.argv[1]))
print("trained to the end", flush=True)
"""


def test_ctrl_c_during_sentencepiece_training_stops_the_build(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "training\n"
        # "training" is printed just before the C call: a SIGINT sent at once could land while
        # the script still runs Python (on a loaded machine), where the handler raises Stopped
        # as it should but this bare script has no CLI to turn it into exit 130
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)  # before the fix: the call ran on, no end
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == 130, err
    assert "SIGINT: not taken within" in err and "Traceback" not in err, err
    assert "trained to the end" not in out
