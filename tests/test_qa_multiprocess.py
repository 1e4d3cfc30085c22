"""Several processes (torchrun, gloo on CPU) as a user runs them: what every rank must agree
on, and what is said once per run rather than once per process."""

from __future__ import annotations

import json
from pathlib import Path

import engine_harness as h
import pytest
import torch

from tibnlp.training.learning_check import LearningCheck
from tibnlp.training.loop import Progress


@pytest.mark.slow
def test_time_budgeted_ranks_update_with_the_same_lr(tmp_path: Path) -> None:
    """Under a time budget the share spent sets the lr; rank 1 starts its clock while rank 0
    is still opening the MLflow run, so with a clock of its own it trained its replica with
    another rate and the ranks' weights parted."""
    config = {"max_steps": 100_000, "time_budget_s": 2.0, "checkpoint_every": 0}
    config |= {"eval_every": 100_000, "dropout": 0.0, "rank_weights": True}
    (tmp_path / "run").mkdir()  # (no checkpoint writes it)
    done = h.torchrun(tmp_path / "run", config)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["stopped_by"] == "time_budget"
    a = torch.load(tmp_path / "run" / "weights-rank0.pt", weights_only=True)
    b = torch.load(tmp_path / "run" / "weights-rank1.pt", weights_only=True)
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_learning_check_warns_on_the_main_process_only(capsys: pytest.CaptureFixture) -> None:
    """Every rank runs the check (its verdict rides in the checkpoint); one prints."""
    for say in (True, False):
        check = LearningCheck(0.10, 0.25, lambda at: at.step / 100, say=say)
        check(Progress(50, 0.0, 0.0), {"mask_accuracy": 0.11})
        assert check.warned
    assert capsys.readouterr().err.count("warning: held-out MLM accuracy") == 1


WORKER = """
import os
import sys

import torch.distributed as dist

from tibnlp.errors import TibnlpError, run_script
from tibnlp.training.ranks import wait_for_main


def main():
    who = sys.argv[1]  # "before": every rank, before the group; "all"; or one rank's number
    if who == "before":
        raise TibnlpError("bad config", "fix it")
    if who == "before-1" and os.environ["LOCAL_RANK"] == "1":  # its own (a file it lacks)
        raise TibnlpError("bad config of rank 1", "fix it")
    dist.init_process_group("gloo")
    if who == "0-waited-for":  # rank 0 fails while the others wait for it (`wait_for_main`)
        if dist.get_rank() == 0:
            raise TibnlpError("bad input (0)", "fix it")
        try:
            wait_for_main()
        except TibnlpError:
            print(f"rank {dist.get_rank()} stopped by rank 0's error", file=sys.stderr)
            raise
    if who in ("all", str(dist.get_rank())):
        raise TibnlpError(f"bad input ({who})", "fix it")
    dist.barrier()  # the others wait here for the one that failed


run_script(main)
"""


def _launch(tmp_path: Path, who: str, monitor_s: float = 0.1) -> str:
    """WORKER under torchrun in two processes (torchrun looking at them every `monitor_s`);
    its stderr."""
    import os
    import subprocess
    import sys

    from tibnlp.tracking.server import free_port

    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parent.parent), *sys.path])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    cmd += ["--master_port", str(free_port()), "--monitor-interval", str(monitor_s)]
    cmd += [str(script), who]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    return done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("who", ["before", "all"])
def test_an_error_every_rank_meets_is_printed_once(tmp_path: Path, who: str) -> None:
    err = _launch(tmp_path, who)
    assert err.count("error: bad") == 1, err
    assert err.count("hint: fix it") == 1, err


@pytest.mark.slow
def test_an_error_of_one_local_rank_alone_before_the_group_is_printed(tmp_path: Path) -> None:
    """A rank other than local rank 0 printed nothing before the group, leaving its error to
    rank 0; now it waits for rank 0 to say it (and be stopped by the launcher), and says its
    own when rank 0 has none. (Exiting at once, it also got rank 0 stopped before rank 0
    printed the error both met: no message at all.)"""
    err = _launch(tmp_path, "before-1")
    assert err.count("error: bad config of rank 1") == 1, err


@pytest.mark.slow
def test_an_error_of_one_rank_alone_is_still_printed(tmp_path: Path) -> None:
    err = _launch(tmp_path, "1")
    assert err.count("error: bad input (1)") == 1, err


@pytest.mark.slow
def test_ranks_waiting_for_rank_0_stop_with_its_error(tmp_path: Path) -> None:
    """Rank 0 refuses alone (it alone reads the output folder) while the others wait for it
    with no timeout: they stop with its error, said once, instead of waiting for the
    launcher (which, on another node, may never come). torchrun looks late here, so the
    waiting rank gets there first."""
    err = _launch(tmp_path, "0-waited-for", monitor_s=5)
    assert err.count("error: bad input (0)") == 1, err
    assert "rank 1 stopped by rank 0's error" in err, err


def test_a_launcher_that_cannot_start_is_named(tmp_path: Path) -> None:
    """A misspelt `launch:` is the user's mistake: a message naming it, not a traceback."""
    from tibnlp.config import Config
    from tibnlp.errors import TibnlpError
    from tibnlp.pipeline.context import StageContext
    from tibnlp.pipeline.launch import launch_stage
    from tibnlp.tracking import Tracker

    ctx = StageContext(
        "pretrain", "pretrain", "", Config(), {}, tmp_path, False, Tracker("x", enabled=False)
    )
    with pytest.raises(TibnlpError, match=r"launch: torchrunx .*cannot start.*torchrunx"):
        launch_stage("torchrunx --nproc_per_node 2 -m", "pretrain", ctx)


class _Engine:
    """What `checkpoint.load` asks of a DeepSpeed engine before loading; DeepSpeed's own load
    would stop with its traceback, so reaching it fails the test."""

    def __init__(self, zero_stage: int, processes: int) -> None:
        self.stage, self.dp_world_size = zero_stage, processes

    def zero_optimization_stage(self) -> int:
        return self.stage

    def load_checkpoint(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("DeepSpeed's load reached")


def _checkpoints(root: Path, partitions: int) -> Path:
    """A complete checkpoint at step 4 as `partitions` ZeRO processes (0: stage 0) left it."""
    from tibnlp.training import checkpoint

    folder = root / "checkpoints" / checkpoint.tag_for(4)
    folder.mkdir(parents=True)
    (folder / "mp_rank_00_model_states.pt").write_bytes(b"")
    for rank in range(partitions):
        (folder / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(b"")
    (root / "checkpoints" / checkpoint.MARKER).write_text(checkpoint.tag_for(4) + "\n")
    return root / "checkpoints"


@pytest.mark.parametrize(
    ("partitions", "stage", "processes", "says"),
    [
        (2, 2, 1, r"split over 2 processes; this run has 1.*\n.*nproc_per_node 2"),
        (0, 2, 1, r"written with engine.zero_stage 0; this run has engine.zero_stage 2"),
        (2, 0, 2, r"written with engine.zero_stage 1 or 2 .*this run has engine.zero_stage 0"),
    ],
)
def test_resume_into_another_optimizer_layout_is_refused_by_name(
    tmp_path: Path, partitions: int, stage: int, processes: int, says: str
) -> None:
    from tibnlp.errors import TibnlpError
    from tibnlp.training import checkpoint

    directory = _checkpoints(tmp_path, partitions)
    with pytest.raises(TibnlpError, match=says):
        checkpoint.load(_Engine(stage, processes), directory, True)


def test_resume_into_the_same_layout_reaches_the_load(tmp_path: Path) -> None:
    from tibnlp.training import checkpoint

    directory = _checkpoints(tmp_path, 2)
    with pytest.raises(AssertionError, match="DeepSpeed's load reached"):
        checkpoint.load(_Engine(2, 2), directory, True)


WAITER = """
import time
from datetime import timedelta

import torch.distributed as dist

from tibnlp.training import worker_exit
from tibnlp.training.ranks import wait_for_main

dist.init_process_group("gloo", timeout=timedelta(seconds=2))
rank = dist.get_rank()
if rank == 0:
    time.sleep(5)  # as rank 0 waits for another run's folder (`--wait`): past the timeout
wait_for_main()
dist.barrier()
print(f"rank {rank} through", flush=True)
dist.destroy_process_group()
worker_exit.left_group()
worker_exit.end(0)  # as the CLI ends a launched worker (no gloo abort at finalization)
"""


@pytest.mark.slow
def test_other_ranks_wait_for_rank_0_past_the_group_timeout(tmp_path: Path) -> None:
    """`pretrain --wait` under several processes: rank 0 waits for the folder while the
    others wait for rank 0; a collective there gave up after the group's timeout (gloo:
    "Timed out waiting ... for recv") and the run failed with a traceback."""
    import os
    import subprocess
    import sys

    from tibnlp.tracking.server import free_port

    script = tmp_path / "waiter.py"
    script.write_text(WAITER)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parent.parent), *sys.path])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    cmd += ["--master_port", str(free_port()), str(script)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rank 0 through" in done.stdout and "rank 1 through" in done.stdout


def test_a_shard_lost_since_the_save_still_reaches_the_load(tmp_path: Path) -> None:
    """The checkpoint's layout record, not the shards on disk, says how it was saved: rank
    1's shard deleted is then a damaged checkpoint (DeepSpeed's load fails on it and `load`
    moves to an older one), not a checkpoint of one process that a refusal would name."""
    from tibnlp.training import checkpoint

    directory = _checkpoints(tmp_path, 2)
    folder = directory / checkpoint.tag_for(4)
    (folder / checkpoint.LAYOUT).write_text(json.dumps({"zero_stage": 2, "processes": 2}))
    (folder / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    with pytest.raises(AssertionError, match="DeepSpeed's load reached"):
        checkpoint.load(_Engine(2, 2), directory, True)
