"""`tibnlp corpus prepare` stopped in its multi-process step (normalise, filter, split): it
leaves as stopped (130 for Ctrl-C, 143 for SIGTERM), with no worker left and nothing
half-written. Under `datasets.map(num_proc=...)` it hung (the pool waited on workers it
had forked again) or ended in pages of traceback with exit 1 (tibnlp.text.process_map)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from processes import alive, slow_start, stop_at_two_workers

ROOT = Path(__file__).resolve().parents[1]

# the CLI with a slow step: each batch notes its worker's pid, then takes half a second
SLOW = """
import os, sys, time
from pathlib import Path
from tibnlp.text import prepare

real = prepare.process_documents
marks = Path(sys.argv[2])

def slow(batch, **kwargs):
    (marks / f"worker-{os.getpid()}").touch()
    time.sleep(0.5)
    return real(batch, **kwargs)

prepare.process_documents = slow
from tibnlp.cli.main import main
sys.argv = ["tibnlp", "corpus", "prepare", "-i", sys.argv[1], "-o", sys.argv[3],
            "--num-proc", "2", "--no-progress"]
main()
"""


@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["ctrl-c", "sigterm", "killed"]
)
def test_a_stop_in_the_multi_process_step_leaves_cleanly(tmp_path: Path, sig: int) -> None:
    """The signal goes to the whole process group, as a terminal's Ctrl-C and `timeout` send
    it: the workers get it too. SIGKILL goes to the command alone (the OOM killer): its
    workers stop too, not going on into a folder nobody will publish."""
    corpus = tmp_path / "in.txt"
    doc = "བོད་ཀྱི་ལོ་རྒྱུས་ནི་རིང་པོ་ཡིན། དེང་སང་གི་གནས་ཚུལ་གསར་པ།\n\n"
    corpus.write_text(doc * 200, encoding="utf-8")
    marks, out = tmp_path / "marks", tmp_path / "out"
    marks.mkdir()
    code, text, workers = stop_at_two_workers(
        SLOW, [str(corpus), str(marks), str(out)], marks, sig, ROOT
    )
    if code is None:  # SIGKILL: the workers are gone
        return
    assert code == 128 + sig, text[-3000:]
    assert "Traceback" not in text and "couldn't be hashed" not in text, text[-3000:]
    assert not any(alive(pid) for pid in workers)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "marks"]  # no staging


# the CLI whose workers take their time to start (`processes.slow_start`)
STARTING = (
    slow_start("tibnlp.text.process_map", "_map_shard", "sys.argv[2]")
    + """
from tibnlp.cli.main import main
sys.argv = ["tibnlp", "corpus", "prepare", "-i", sys.argv[1], "-o", sys.argv[3],
            "--num-proc", "2", "--no-progress"]
main()
"""
)


def test_a_ctrl_c_as_the_workers_start_stops_cleanly(tmp_path: Path) -> None:
    """A Ctrl-C reaching a worker before it ignored SIGINT (its first act) raised
    KeyboardInterrupt there: "Process ForkProcess-N: Traceback ... KeyboardInterrupt"."""
    corpus = tmp_path / "in.txt"
    corpus.write_text("བོད་ཀྱི་ལོ་རྒྱུས་ནི་རིང་པོ་ཡིན།\n\n" * 50, encoding="utf-8")
    marks, out = tmp_path / "marks", tmp_path / "out"
    marks.mkdir()
    args = [str(corpus), str(marks), str(out)]
    code, text, workers = stop_at_two_workers(STARTING, args, marks, signal.SIGINT, ROOT)
    assert code == 130, text[-3000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    assert not any(alive(pid) for pid in workers)
    assert not (tmp_path / "worker-interrupted").exists()  # the Ctrl-C was the parent's alone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "marks"]  # no staging
