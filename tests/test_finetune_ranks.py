"""Data-parallel fine-tuning: rank 0 alone reads and writes the output folder, and the
other ranks take what it found (tibnlp.training.ranks). Every rank used to write the same
seed folder: two processes replacing one folder at once failed on one of them about one
time in ten with both starting together (40 tries of `fsutil.staged_dir`, two processes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_finetune import cfg_flags, env  # noqa: F401  (the fixture)

ROOT = Path(__file__).resolve().parents[1]

# the CLI, with everything that reads or writes the output folder refused on ranks but 0
WORKER = """
import os, sys
from tibnlp.training import finetune, soup_run

def refuse(*_args, **_kwargs):
    raise AssertionError(f"rank {os.environ['RANK']} touched the output folder")

if os.environ["RANK"] != "0":
    refused = ("resumed_seed", "save_seed", "save_classifier", "write_results")
    for name in (*refused, "require_same_dataset"):
        setattr(finetune, name, refuse)
    soup_run._load_copy = refuse
    soup_run.atomic_file = refuse
from tibnlp.cli.main import main
sys.argv = ["tibnlp", *sys.argv[1:]]
main()
"""


@pytest.mark.slow
def test_only_rank_0_reads_and_writes_and_a_rerun_resumes_on_every_rank(env) -> None:  # noqa: F811
    """Two ranks fine-tune a two-copy soup; the same command again reports the finished
    seed on both ranks from rank 0's record (each rank reading its own would hang on nodes
    without a shared file system, where the other rank finds nothing and trains)."""
    from tibnlp.tracking.server import free_port

    script = env.tmp / "worker.py"
    script.write_text(WORKER, encoding="utf-8")
    sets = [a for item in cfg_flags(env, "finetune.epochs=1") for a in ("--set", item)]
    keep = {"RANK", "WORLD_SIZE", "LOCAL_RANK"}
    child_env = {k: v for k, v in os.environ.items() if k not in keep}
    child_env["PYTHONPATH"] = str(ROOT)
    outs = []
    for _ in range(2):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
        cmd += ["--master_port", str(free_port()), str(script), "finetune", "tncc"]
        cmd += ["--seeds", "1", "--set", "finetune.soup=2", *sets]
        proc = subprocess.run(
            cmd, env=child_env, cwd=env.tmp, capture_output=True, text=True, timeout=600
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-4000:]
        outs.append(out)
    seed = next((env.tmp / "runs").glob("*/*/seed-1"))
    assert (seed / "seed_result.json").is_file() and (seed / "model.safetensors").is_file()
    assert (seed.parent / "results.json").is_file()
    assert "finished earlier" not in outs[0]
    assert outs[1].count("seed 1: finished earlier") == 1  # said by rank 0, once
