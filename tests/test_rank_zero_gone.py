"""Ranks waiting for rank 0 (`ranks.wait_for_main`: no timeout, rank 0's work may take an
hour) when rank 0 will never get there: they waited for good. Two processes started as
torchrun starts them (RANK, WORLD_SIZE, MASTER_ADDR/PORT), the group's store held by the
launcher (here the test: nothing stops the waiting rank but itself) or, as a plain `env://`
launch has it, by rank 0."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from torch.distributed import TCPStore

from tibnlp.errors import ConfigError
from tibnlp.tracking.server import free_port
from tibnlp.training import ranks

ROOT = Path(__file__).resolve().parents[1]

# a rank of two: rank 0 does `how` (argv[1]) before it gets where rank 1 waits for it
RANK = """
import os, signal, sys, time
import torch.distributed as dist
from tibnlp.errors import run_script
from tibnlp.training.ranks import announce_main, wait_for_main

def main():
    how = sys.argv[1]
    dist.init_process_group("gloo")
    announce_main()  # (as `engine.init_distributed` does)
    dist.barrier()  # (both in the group before rank 0 goes on)
    if dist.get_rank() == 0:
        time.sleep(60 if how in ("at-work", "store-lost") else 1)  # (at work)
        if how == "killed":  # the OOM killer
            os.kill(os.getpid(), signal.SIGKILL)
        if how == "failed":
            raise RuntimeError("a bug in rank 0")
    print(f"rank {dist.get_rank()} waits", flush=True)
    wait_for_main("tokenise the corpus")
    print(f"rank {dist.get_rank()} through", flush=True)

run_script(main)
"""


def _two_ranks(how: str, launcher_store: bool, limit: str = "") -> list[tuple[int, str]]:
    """RANK as ranks 0 and 1: each one's (exit status, output); rank 0 is ended once rank 1
    has (it may be at work still). With `launcher_store`, this process holds the store;
    "store-lost" ends it once rank 1 waits."""
    port = free_port()
    store = None
    if launcher_store:
        store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    env = {k: v for k, v in os.environ.items() if k != ranks.LIMIT_ENV}
    env |= {"PYTHONPATH": str(ROOT), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    env |= {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    env["TORCHELASTIC_USE_AGENT_STORE"] = str(launcher_store)  # (torchrun's: True)
    if limit:
        env[ranks.LIMIT_ENV] = limit
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, how],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in (0, 1)
    ]
    try:
        if how == "store-lost":  # (its launcher gone, as on another node)
            assert procs[1].stdout is not None
            while procs[1].stdout.readline() not in ("rank 1 waits\n", ""):
                pass
            del store  # (the last reference: the store's server stops)
        waiting = procs[1].communicate(timeout=120)  # (a hang guard: it waited for good)
        procs[0].kill()
        return [(procs[0].wait(), procs[0].communicate()[0]), (procs[1].returncode, waiting[0])]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


GONE = r"rank 0 \(process \d+ on \S+\) is gone before it could tokenise the corpus"
ENDED = r"rank 0 \(process \d+ on \S+\) ended before it could tokenise the corpus"
LOST = (
    r"rank 1 lost the process group's store \(127\.0\.0\.1:\d+\) while waiting for rank 0 "
    r"to tokenise the corpus: rank 0, or the launcher that held the store, is gone"
)


@pytest.mark.parametrize(
    ("how", "launcher_store", "says"),
    [
        ("killed", True, GONE),  # under torchrun, with a launcher that did not stop rank 1
        # rank 0 held the store: its death is seen, or the store going with it (torch then
        # warns of the connection, with its C++ frames)
        ("killed", False, f"({GONE}|{LOST})"),
        ("failed", True, f"({ENDED}|{GONE})"),  # (said as it ends; or seen gone first)
        ("store-lost", True, LOST),
    ],
    ids=["killed", "killed-holding-the-store", "failed", "store-lost"],
)
def test_a_rank_waiting_for_a_rank_0_that_is_gone_stops_saying_so(
    how: str, launcher_store: bool, says: str
) -> None:
    (_, first), (code, err) = _two_ranks(how, launcher_store)
    text = " ".join(err.split())
    assert code == ranks.MainGone.exit_code, err[-3000:]
    assert len(re.findall(f"error: {says}", text)) == 1 and "hint: rank 0's output" in text, text
    assert "Traceback" not in text, err[-3000:]
    if launcher_store and how in ("killed", "failed"):  # (the store is there: no word from torch)
        assert "frame #" not in text, err[-3000:]
    if how == "failed":  # rank 0's own error is its to say
        assert "RuntimeError: a bug in rank 0" in first, first[-3000:]


def test_a_rank_0_at_work_past_the_limit_set_is_named_with_the_limit() -> None:
    """Where rank 0 cannot be looked at (another node), the wait has a limit (a day unless
    set); set, it holds everywhere. The message names what was waited for and the knob."""
    _, (code, err) = _two_ranks("at-work", True, limit="1")
    text = " ".join(err.split())
    says = r"error: rank 1 waited \d+ s for rank 0 \(process \d+ on \S+\) to tokenise the corpus"
    assert code == ranks.MainGone.exit_code and re.search(says, text), text
    assert f"the limit ({ranks.LIMIT_ENV})" in text and f"set {ranks.LIMIT_ENV} to more" in text


def test_a_rank_0_that_gets_there_late_is_waited_for() -> None:
    """Looking for rank 0 takes no live rank 0 for a gone one: both go on."""
    _, (code, out) = _two_ranks("slow", True)
    assert code == 0 and "rank 1 through" in out, out[-3000:]


@pytest.mark.parametrize("value", ["soon", "-1", "inf", "nan"])
def test_a_bad_wait_limit_is_named(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ranks.LIMIT_ENV, value)
    with pytest.raises(ConfigError, match=rf"{ranks.LIMIT_ENV}='{re.escape(value)}'.*>= 0"):
        ranks.announce_main()  # (every rank, as the group starts: not after rank 0's hour)
    monkeypatch.setenv(ranks.LIMIT_ENV, "0")
    assert ranks.wait_limit() == 0.0
