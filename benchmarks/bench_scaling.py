"""Pretraining throughput with 1 vs 2 processes on this machine (DeepSpeed data parallel, gloo).

    python benchmarks/bench_scaling.py [--steps 8] [--repeats 2] [--seq-len 128] [--batch 32] \
        [--vocab 30000]

Both layouts train the real `AlbertForPretraining` at the ALBERT-tiny shape (vocab 30000,
E=128, D=384, 4 layers, 12 heads, FFN 1536) through the real engine step (`TrainLoop.
train_step`: DeepSpeed forward/backward/all-reduce/AdamW) on the same global batch; 1 process
uses all cores as threads, 2 processes (torchrun) one share each. Token ids are random and 15%
of positions are masked at random: throughput depends on the shapes, not on the text. The two
layouts alternate `--repeats` times; the ratio of medians goes to benchmarks/results/scaling.md.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tibnlp.errors import run_script
from tibnlp.fsutil import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 30000  # ALBERT-tiny's, the table's; a smaller one makes a smoke run cheap


def worker(out: Path, steps: int, seq_len: int, batch: int, vocab: int = VOCAB) -> None:
    import torch

    from tibnlp.config import EngineConfig, ModelConfig, OptimizerConfig
    from tibnlp.models.pretraining import AlbertForPretraining
    from tibnlp.training.engine import init_distributed, shutdown
    from tibnlp.training.loop import LoopSettings
    from tibnlp.training.wiring import start_training

    world = init_distributed(EngineConfig())
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=vocab, max_len=max(512, seq_len))
    cfg.heads.threshold = seq_len
    model = AlbertForPretraining(cfg)
    training = start_training(model, EngineConfig(), OptimizerConfig(), batch, 0, 10**6, world)

    def collate(indices: list[int], key: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(key)
        ids = torch.randint(5, vocab, (len(indices), seq_len), generator=g)
        chosen = torch.rand(ids.shape, generator=g) < 0.15
        return {
            "input_ids": torch.where(chosen, torch.full_like(ids, 4), ids),
            "attention_mask": torch.ones_like(ids),
            "token_type_ids": torch.zeros_like(ids),
            "mlm_labels": torch.where(chosen, ids, torch.full_like(ids, -100)),
            "sop_labels": torch.randint(0, 2, (len(indices),), generator=g),
        }

    def plan(epoch: int) -> list[list[int]]:
        return [list(range(i * batch, (i + 1) * batch)) for i in range(steps + 2)]

    data = training.batches(plan, collate, batch)
    settings = LoopSettings(1, 1, 1, 0, 1, 1, Path(tempfile.mkdtemp()), progress=False)
    loop = training.loop(data, None, settings)
    for _ in range(2):  # warm-up: allocator, first all-reduce
        loop.train_step(False)
    start = time.perf_counter()
    tokens = 0.0
    for _ in range(steps):
        _, n, _ = loop.train_step(False)
        tokens += n
    elapsed = time.perf_counter() - start
    if world.is_main:
        out.write_text(
            json.dumps(
                {
                    "world": world.size,
                    "tokens_per_s": tokens / elapsed,
                    "threads": torch.get_num_threads(),
                    "steps": steps,
                }
            )
        )
    shutdown(world)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_layout(procs: int, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        tail = [
            str(Path(__file__).resolve()),
            "--worker",
            str(out),
            "--steps",
            str(args.steps),
            "--seq-len",
            str(args.seq_len),
            "--batch",
            str(args.batch),
            "--vocab",
            str(args.vocab),
        ]
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
        env["PYTHONPATH"] = str(ROOT)
        if procs == 1:
            cmd = [sys.executable, *tail]
        else:
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc_per_node",
                str(procs),
                "--master_port",
                str(_free_port()),
                *tail,
            ]
            env.pop("OMP_NUM_THREADS", None)
        subprocess.run(cmd, env=env, check=True, capture_output=True)
        return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", type=Path)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=VOCAB)
    ap.add_argument("--output", type=Path, default=ROOT / "benchmarks/results/scaling.md")
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.steps, args.seq_len, args.batch, args.vocab)
        return
    results: dict[int, list[float]] = {1: [], 2: []}
    load_start = os.getloadavg()[0]
    for r in range(args.repeats):
        for procs in (1, 2) if r % 2 == 0 else (2, 1):
            res = run_layout(procs, args)
            results[procs].append(res["tokens_per_s"])
            print(
                f"repeat {r}: {procs} process(es): {res['tokens_per_s']:.0f} tokens/s", flush=True
            )
    one, two = statistics.median(results[1]), statistics.median(results[2])
    load = os.getloadavg()[0]
    lines = [
        "# Pretraining scaling: 1 vs 2 processes (CPU, DeepSpeed ZeRO 0, gloo)",
        "",
        f"Command: `python benchmarks/bench_scaling.py --steps {args.steps} --repeats "
        f"{args.repeats} --seq-len {args.seq_len} --batch {args.batch}"
        + (f" --vocab {args.vocab}`" if args.vocab != VOCAB else "`"),
        "",
        f"ALBERT-tiny (vocab {args.vocab}, E=128, D=384, 4 layers, FFN 1536), fp32, AdamW, "
        f"sequence {args.seq_len}, global batch {args.batch}, {args.steps} timed steps after 2 "
        f"warm-up steps; random token ids, 15% masked. Machine: {os.cpu_count()} cores; 1 "
        "process uses all of them as threads, 2 processes one share each. Layouts alternate.",
        "",
        "| processes | tokens/s per run | median |",
        "|---|---|---|",
        f"| 1 | {', '.join(f'{x:.0f}' for x in results[1])} | {one:.0f} |",
        f"| 2 | {', '.join(f'{x:.0f}' for x in results[2])} | {two:.0f} |",
        "",
        f"**Ratio 2 / 1 processes: {two / one:.2f}x.**",
        "",
        f"The machine was shared with other jobs (1-minute load average {load_start:.1f} before, "
        f"{load:.1f} after, on {os.cpu_count()} cores), so absolute figures drift between runs; "
        "read the side-by-side ratio. How to read it: on an idle machine the second process "
        "brings no extra core (one process already runs one intra-op thread per core), so ~1x "
        "minus the gradient all-reduce is what to expect there. Under oversubscription, a "
        "single process with 2 intra-op threads waits at every parallel region for its "
        "slowest (preempted) thread, while 2 single-threaded processes only meet once per "
        "step at the all-reduce, which favours the 2-process layout; a ratio far above 1x "
        "here measures that contention, not a property of the engine.",
    ]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.output, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    run_script(main)
