"""Two-process helper for tests/test_resume_edges.py: each rank gets its own RNG stream (as
`pretrain` seeds dropout per rank), saves a checkpoint, and reports the numbers its stream
gives after the save and after a restore of that checkpoint.

    python -m torch.distributed.run --nproc_per_node 2 tests/rank_rng_script.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import engine_harness as h
import torch


def main(out: Path) -> None:
    from tibnlp.config import EngineConfig, OptimizerConfig
    from tibnlp.training.engine import init_distributed, shutdown
    from tibnlp.training.wiring import start_training

    cfg = EngineConfig(threads=1)
    world = init_distributed(cfg)
    torch.manual_seed(0)
    training = start_training(h.TinyPretrainer(), cfg, OptimizerConfig(), 8, 0, 4, world)
    loop = h.tiny_loop(training, out / "ck", max_steps=4, log_every=1, checkpoint_every=1)
    torch.manual_seed(100 + 7919 * world.rank)  # distinct dropout streams per rank
    loop.save()
    expected = torch.rand(4).tolist()  # what this rank's stream gives next, uninterrupted
    torch.manual_seed(12345)
    assert loop.restore()
    got = torch.rand(4).tolist()  # ... and after resuming from the checkpoint
    (out / f"rank{world.rank}.json").write_text(json.dumps({"expected": expected, "got": got}))
    shutdown(world)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    from tibnlp.training import worker_exit

    worker_exit.end(0)  # as the CLI ends a launched worker
