"""Host work per optimizer step of DeepSpeed's two bf16 paths, on the GPU curve's model.

The H200 lease of 2026-11-26 found the pretraining loop host-bound (about 40 ms a step for
ALBERT-tiny at batch 64 x 128, about 1,600 kernel launches a step) with DeepSpeed's bf16 mode
(bf16 weights, fp32 masters in the ZeRO optimizer) checking every gradient tensor for
overflow (`isfinite`, `amax`, `amin`, logical ops: five kernels a tensor) and copying between
the bf16 and fp32 copies every step. The other path is DeepSpeed's `torch_autocast` section
(fp32 weights, bf16 matmuls), which the CPU already used. The host's cost per step is the
number of operators it dispatches (each a kernel launch or more on a GPU), which does not
depend on the device, so it is counted here on the CPU: aten operators per optimizer step,
split into the step's phases, with the dtype an export would save. Both variants run in
fresh processes (one DeepSpeed world each), side by side in one run.

    PYTHONPATH=. python benchmarks/bench_precision_ops.py --out benchmarks/results/precision_ops.md
    PYTHONPATH=. python benchmarks/bench_precision_ops.py --zero 0 \
        --out benchmarks/results/clip_ops.md

At ZeRO 0 a third variant replaces DeepSpeed's clipping loop by tibnlp's fused one
(`engine.use_fused_clip`, what `tibnlp pretrain` runs at ZeRO 0).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path

from tibnlp.errors import run_script

SHAPE_FROM = Path("pipelines/vectors_proxy.yaml")  # the GPU curve's start model (repo-relative)
ROOT = Path(__file__).resolve().parents[1]
VOCAB = 14245  # its vocabulary (16k asked, 14,245 built from the quickstart's corpus)
VARIANTS = {
    "DeepSpeed bf16 mode (bf16 weights, fp32 masters)": "bf16-mode",
    "DeepSpeed torch_autocast (fp32 weights, bf16 matmuls)": "autocast",
    # the engine's per-parameter clipping loop replaced (engine.use_fused_clip)
    "torch_autocast, tibnlp's fused ZeRO 0 clipping": "autocast-fused-clip",
}
ZERO0_ONLY = {"autocast-fused-clip"}  # ZeRO 1 and 2 clip inside their own optimizer


def child(variant: str, zero: int, steps: int) -> dict:
    """One variant in this process: ops per step by phase, CPU ms per step, weight dtype."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile

    from tibnlp.config import EngineConfig, OptimizerConfig
    from tibnlp.config.core import from_dict
    from tibnlp.config.model import ModelConfig
    from tibnlp.data.masking import IGNORE_INDEX
    from tibnlp.models.pretraining import AlbertForPretraining
    from tibnlp.pipeline.spec import load_pipeline
    from tibnlp.training import engine as engine_mod
    from tibnlp.training.optim import build_optimizer

    world = engine_mod.init_distributed(EngineConfig(threads=1))
    torch.manual_seed(0)
    shape = load_pipeline(ROOT / SHAPE_FROM).config["model"]  # the curve's start: its model's shape
    cfg = from_dict(ModelConfig, {**shape, "vocab_size": VOCAB}, "model")
    model = AlbertForPretraining(cfg, sparse_last_layer=True, sop=False)
    optim = OptimizerConfig(warmup_steps=0)
    # fp32 (no precision section) plus the one under test
    ds = engine_mod.deepspeed_config(EngineConfig(zero_stage=zero), optim, 8, 0, world.size)
    if variant == "bf16-mode":
        ds["bf16"] = {"enabled": True}
    else:  # the variants of tibnlp's path
        ds["torch_autocast"] = dict(engine_mod.AUTOCAST_BF16)
    import deepspeed

    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=build_optimizer(model, optim), config=ds
    )
    if variant == "autocast-fused-clip":
        engine_mod.use_fused_clip(engine, world.size)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, cfg.vocab_size, (8, 32), generator=g)
    labels = torch.full_like(ids, IGNORE_INDEX)
    sel = torch.rand(ids.shape, generator=g) < 0.3
    labels[sel] = ids[sel]
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": None}

    def step() -> None:
        with torch.profiler.record_function("phase:forward"):
            out = engine(**batch, mlm_labels=labels)
        with torch.profiler.record_function("phase:backward"):
            engine.backward(out["loss"])
        with torch.profiler.record_function("phase:optimizer step"):
            engine.step()

    for _ in range(3):  # warm-up: DeepSpeed's first steps set up buckets and state
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(1e3 * (time.perf_counter() - t0))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    ops: Counter[str] = Counter()
    phases: Counter[str] = Counter()
    spans = [
        (e.name.split(":", 1)[1], e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.name.startswith("phase:")
    ]
    for e in prof.events():
        if not e.name.startswith("aten::"):
            continue
        ops[e.name] += 1
        inside = [name for name, start, end in spans if start <= e.time_range.start <= end]
        phases[inside[0] if inside else "other"] += 1
    weights = {str(p.dtype) for p in engine.module.parameters()}
    times.sort()
    return {
        "ops_per_step": sum(ops.values()) / steps,
        "phases": {k: v / steps for k, v in phases.items()},
        "top": [(k, v / steps) for k, v in ops.most_common(8)],
        "cpu_ms_median": times[len(times) // 2],
        "weights": sorted(weights),
        "parameters": sum(1 for _ in model.parameters()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--zero", type=int, default=1, help="ZeRO stage (0 adds the fused-clipping variant)"
    )
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (time: median)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", choices=sorted(VARIANTS.values()))
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.zero, args.steps)))
        return
    from tibnlp.fsutil import atomic_write_text
    from tibnlp.training.engine import hardware_name

    variants = {k: v for k, v in VARIANTS.items() if args.zero == 0 or v not in ZERO0_ONLY}
    runs: dict[str, list[dict]] = {label: [] for label in variants}
    for r in range(args.rounds):  # alternating order, so load drift hits both variants alike
        order = list(variants.items())
        for label, key in order if r % 2 == 0 else reversed(order):
            cmd = [sys.executable, __file__, "--child", key, "--zero", str(args.zero)]
            cmd += ["--steps", str(args.steps)]
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
            runs[label].append(json.loads(done.stdout.strip().splitlines()[-1]))
    results = {  # operator counts repeat exactly; the time is the median over rounds
        label: {**rs[0], "cpu_ms_median": statistics.median(x["cpu_ms_median"] for x in rs)}
        for label, rs in runs.items()
    }
    labels = list(results)
    base = results[labels[0]]
    lines = [
        "# Host work per step: DeepSpeed's bf16 mode against its torch_autocast"
        + (", and tibnlp's fused clipping at ZeRO 0" if len(labels) > 2 else ""),
        "",
        "`PYTHONPATH=. python benchmarks/bench_precision_ops.py"
        + (f" --zero {args.zero}" if args.zero != 1 else "")
        + f"` on {hardware_name()}, one "
        f"thread, DeepSpeed ZeRO {args.zero}, one process. The GPU curve's model (the shape "
        f"of `{SHAPE_FROM}`: E=128, D=128, 4 layers, relative positions, pre-LN; vocab "
        f"{VOCAB}, sparse MLM, no SOP; "
        f"{base['parameters']} parameter tensors), batch 8 x 32 (operator counts do not "
        f"depend on the batch), {args.steps} profiled steps after 3 warm-up steps; "
        f"{args.rounds} alternating rounds, CPU ms the median over them.",
        "",
        "| variant | aten ops per step | forward | backward | optimizer step | CPU ms per step "
        "(median) | weights (what an export saves) |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for label, r in results.items():
        p = r["phases"]
        lines.append(
            f"| {label} | {r['ops_per_step']:,.0f} | {p.get('forward', 0):,.0f} | "
            f"{p.get('backward', 0):,.0f} | {p.get('optimizer step', 0):,.0f} | "
            f"{r['cpu_ms_median']:.1f} | {', '.join(r['weights'])} |"
        )
    outside = {k: r["phases"]["other"] for k, r in results.items() if r["phases"].get("other")}
    if outside:  # operators no phase's span holds (counted in the total only)
        lines += [
            "",
            "Outside the three phases: " + ", ".join(f"{k} {v:,.0f}" for k, v in outside.items()),
        ]
    autocast = results[labels[1]]
    lines += [
        "",
        f"Ratio (bf16 mode / autocast): {base['ops_per_step'] / autocast['ops_per_step']:.2f}x "
        f"the operators, {base['cpu_ms_median'] / autocast['cpu_ms_median']:.2f}x the CPU time "
        "per step (this CPU computes the step too, so the time ratio mixes compute with host "
        "work; on a GPU the operator count is what the host pays).",
    ]
    if len(labels) > 2:
        fused = results[labels[2]]
        lines += [
            "",
            f"Fused clipping: {fused['ops_per_step']:,.0f} against "
            f"{autocast['ops_per_step']:,.0f} operators per step "
            f"({fused['ops_per_step'] / autocast['ops_per_step']:.2f}x; optimizer step "
            f"{fused['phases'].get('optimizer step', 0):,.0f} against "
            f"{autocast['phases'].get('optimizer step', 0):,.0f}), "
            f"{fused['cpu_ms_median'] / autocast['cpu_ms_median']:.2f}x the CPU time.",
        ]
    lines += [
        "",
        "Most frequent operators per step:",
        "",
    ]
    for label, r in results.items():
        top = ", ".join(f"`{k}` {v:.0f}" for k, v in r["top"])
        lines.append(f"- {label}: {top}")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        atomic_write_text(args.out, text)


if __name__ == "__main__":
    run_script(main)
