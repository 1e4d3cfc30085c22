"""The MLM collator's host time: this checkout's `MlmCollator` against the one at a git revision,
same batches of a real pretraining dataset, alternating rounds in one run.

Why it matters: on the H100 the main job's pretraining loop spent about 80 ms a step whatever
the rows' length (benchmarks/results/gpu.md). A step's batch is collated on the host, in a
background thread when prefetching; Python that holds the GIL there delays every kernel launch
of the main thread, so per-row Python in the collator is a fixed cost per step.

Two figures per implementation:
- collation: median ms per batch (`batch_size` rows), the collator alone;
- a stand-in GPU step: the main thread takes the next batch from the loop's prefetcher and
  launches `--launches` small torch ops (each releases and retakes the GIL, as a kernel launch
  does) while the prefetcher collates the batch after it; median ms per step, beside the same
  step with the batches ready and no thread (the floor).

Both collators must give identical tensors on every batch (asserted): the change is speed only.

    python benchmarks/bench_collate.py --data RUN/model/data [--ref 177c8d2] [--json FILE]

`--data`: the `data` folder of a pretraining run's output (`tibnlp pretrain` writes it beside
the model); `--ref`: the revision whose `tibnlp/data/masking.py` is the baseline.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tibnlp.data.masking import MaskingIds, MlmCollator
from tibnlp.data.pretraining import length_bucketed_batches, load_pretraining_dataset
from tibnlp.errors import run_script
from tibnlp.fsutil import atomic_write_text
from tibnlp.training.batches import ShardedBatches
from tibnlp.training.engine import hardware_name
from tibnlp.training.prefetch import Prefetched
from tibnlp.training.pretrain import dataset_rows

REPO = Path(__file__).resolve().parents[1]


def load_reference(rev: str) -> Any:
    """`tibnlp/data/masking.py` as it was at `rev`, imported as a module of its own."""
    source = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{rev}:tibnlp/data/masking.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "masking_ref.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("masking_ref", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["masking_ref"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def time_collation(collate: Callable[[list, int], Any], batches: list[list[dict]]) -> float:
    times = []
    for i, examples in enumerate(batches):
        t0 = time.perf_counter()
        collate(examples, i)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def step_ms(
    collate: Callable[[list, int], Any] | None, batches: list[list[dict]], launches: int
) -> float:
    """Median ms of a stand-in GPU step: `launches` small torch ops on the main thread (each
    releases and retakes the GIL, as a kernel launch does) after taking the next batch from
    the loop's prefetcher (`tibnlp.training.prefetch.Prefetched`), which collates the batch
    after it in its thread. `collate=None`: the batches are ready, no thread (the floor)."""
    rows = len(batches[0])
    make = collate or (lambda ready, key: ready)
    source = ShardedBatches(  # batch i of one epoch is `batches[i]`, served in order
        lambda epoch: [[i] * rows for i in range(len(batches))],
        lambda indices, key: make(batches[indices[0]], key),
        rows,
        0,
        1,
        1,
    )
    feed: Any = Prefetched(source, pin=False) if collate else source
    x = torch.zeros(64)
    times = []
    for _ in range(len(batches)):
        t0 = time.perf_counter()
        feed.next()
        for _ in range(launches):
            x.add_(1.0)
        times.append(time.perf_counter() - t0)
    if collate:
        feed._drop()  # let the thread finish its last batch before the next measurement
    return statistics.median(times[2:]) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument(
        "--ref", default="177c8d2", help="git revision of the baseline (default: the per-row one)"
    )
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--mask-prob", type=float, default=0.3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--launches", type=int, default=1500, help="small ops per stand-in step")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)

    data, _ = load_pretraining_dataset(args.data)
    train = data["train"]
    plan = length_bucketed_batches(list(train["length"]), args.batch_size, 42, 0)
    batches = [dataset_rows(train, b) for b in plan[: args.batches]]
    size = 1 + max(max(r["input_ids"]) for b in batches for r in b)  # replacements' range
    ids = MaskingIds(size=size)
    ref = load_reference(args.ref)
    ours = MlmCollator(ids, mask_prob=args.mask_prob, seed=42)
    theirs = ref.MlmCollator(ids, mask_prob=args.mask_prob, seed=42)
    for i, examples in enumerate(batches):
        a, b = ours(examples, i), theirs(examples, i)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), f"batch {i}"

    keys = ("ref_ms", "ours_ms", "floor_step_ms", "ref_step_ms", "ours_step_ms")
    timings: dict[str, list[float]] = {k: [] for k in keys}
    for _ in range(args.rounds):
        timings["ref_ms"].append(time_collation(theirs, batches))
        timings["ours_ms"].append(time_collation(ours, batches))
        timings["floor_step_ms"].append(step_ms(None, batches, args.launches))
        timings["ref_step_ms"].append(step_ms(theirs, batches, args.launches))
        timings["ours_step_ms"].append(step_ms(ours, batches, args.launches))
    med = {k: statistics.median(v) for k, v in timings.items()}
    tokens = statistics.mean(sum(len(r["input_ids"]) for r in b) for b in batches)
    result = {
        "cpu": hardware_name(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ref": args.ref,
        "batch_size": args.batch_size,
        "mean_tokens_per_batch": tokens,
        "rounds": timings,
        "median": med,
        "collation_speedup": med["ref_ms"] / med["ours_ms"],
        "launches": args.launches,
    }
    print(
        f"collation, ms per batch of {args.batch_size} ({tokens:.0f} tokens): "
        f"{args.ref} {med['ref_ms']:.1f}, this checkout {med['ours_ms']:.1f} "
        f"({result['collation_speedup']:.1f}x)\n"
        f"stand-in step ({args.launches} small ops) with the prefetcher collating beside it, "
        f"median ms: no collation {med['floor_step_ms']:.1f}, {args.ref} "
        f"{med['ref_step_ms']:.1f}, this checkout {med['ours_step_ms']:.1f}"
    )
    if args.json:
        atomic_write_text(args.json, json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    run_script(main)
