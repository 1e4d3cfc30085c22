"""`tibnlp pretrain` stopped while it tokenises the corpus over several processes: it leaves
as stopped (130 for Ctrl-C, 143 for SIGTERM), with no worker left, no traceback and no
half-written data. Under `datasets.map(num_proc=...)` it printed pages of worker tracebacks
and exited 1 (the pool could hang too, as it did for `corpus prepare`:
tibnlp.text.process_map), and its shards were written into the prepared corpus's folder."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from processes import alive, stop_at_two_workers
from tibetan_fixtures import prepared_inputs

ROOT = Path(__file__).resolve().parents[1]

# the CLI with a slow tokenising: each batch notes its worker's pid, then takes a second
SLOW = """
import os, sys, time
from pathlib import Path
from tibnlp.data import pretraining

real = pretraining._examples_batch
root, marks = Path(sys.argv[1]), Path(sys.argv[2])

def slow(batch, **kwargs):
    (marks / f"worker-{os.getpid()}").touch()
    time.sleep(1.0)
    return real(batch, **kwargs)

pretraining._examples_batch = slow
from tibnlp.cli.main import main
sys.argv = ["tibnlp", "pretrain"] + [
    "--set=" + s
    for s in (f"pretrain.corpus={root / 'corpus'}", f"pretrain.vocab={root / 'vocab'}",
              f"pretrain.output={root / 'out'}", "pretrain.seq_len=32",
              "engine.num_workers=2", "tracking.enabled=false")
]
main()
"""


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["ctrl-c", "sigterm", "killed"]
)
def test_a_stop_while_tokenising_leaves_cleanly(tmp_path: Path, sig: int) -> None:
    """The signal goes to the whole process group, as a terminal's Ctrl-C and `timeout` send
    it: the workers get it too. SIGKILL goes to the command alone (the OOM killer): its
    workers stop too."""
    root = prepared_inputs(tmp_path, n_docs=200, heldout=20)
    corpus_files = _files(root / "corpus")
    marks = tmp_path / "marks"
    marks.mkdir()
    code, text, workers = stop_at_two_workers(SLOW, [str(root), str(marks)], marks, sig, ROOT, 180)
    if code is None:  # SIGKILL: the workers are gone
        return
    assert code == 128 + sig, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert not any(alive(pid) for pid in workers)
    out = root / "out"
    assert not [f for f in (_files(out) if out.exists() else []) if "data" in f]  # no staging
    assert _files(root / "corpus") == corpus_files  # nothing written beside the corpus
