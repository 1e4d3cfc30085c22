"""`run loop`: where the real pretraining step's time goes.

On an H100 (2026-11-25) the main job's corpus stage (pipelines/gpu_curve.yaml: D=128, 4
layers, batch 64 x 128, bf16, ZeRO 1) trained at 80-110 k tokens/s, and its title stage (short
rows) at 20 k: about 80 ms a step either way, while a bare step of the larger ALBERT-tiny ran at
1.7 M tokens/s (`speed`). A fixed cost per step, so the host, not the GPU. This part runs that
stage's config through `run_pretraining` in this process for `steps` steps and reports, over a
window after warm-up: the step's wall time (synchronised) and the share spent waiting for the
next batch, the torch profiler's top operators by self CPU and self device time, and the
Python functions with the most own time (cProfile). GPU busy share from NVML over the window.

    python -m benchmarks.gpu.loopprof CONFIG.yaml OUT_DIR [--steps 80] [--window 30]
        [--threads N] [--no-prefetch] [--deepspeed-clip] [--deepspeed-allreduce]

Two suspects get a switch each, so one lease compares them side by side: `--threads` (the
default gives a lone process every core as torch intra-op threads, whose OpenMP workers may
spin against the main thread while the prefetch thread masks on the CPU) and `--no-prefetch`
(the background collation and pinning, LoopSettings.prefetch). `--deepspeed-clip` leaves
DeepSpeed's per-parameter clipping loop in place of ZeRO 0's `engine.fused_clip`;
`--deepspeed-allreduce` keeps the gradient all-reduce a lone process at ZeRO 0 now skips
(`engine.skip_lone_allreduce`).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import time
from pathlib import Path
from typing import Any

import torch


def _top_ops(prof: Any, key: str, n: int = 15) -> list[dict[str, Any]]:
    rows = []
    events = [e for e in prof.key_averages() if getattr(e, key, 0) > 0]
    for e in sorted(events, key=lambda e: getattr(e, key), reverse=True)[:n]:
        rows.append({"op": e.key[:70], "calls": e.count, "ms": getattr(e, key) / 1e3})
    return rows


def _top_python(host: cProfile.Profile, n: int = 15) -> list[dict[str, Any]]:
    stats = pstats.Stats(host, stream=io.StringIO())
    rows = []
    entries = stats.stats.items()  # type: ignore[attr-defined]
    ordered = sorted(entries, key=lambda kv: kv[1][2], reverse=True)[:n]
    for (file, line, name), (_, calls, own, cum, _) in ordered:
        where = f"{Path(file).name}:{line}({name})"
        rows.append(
            {"function": where[:80], "calls": calls, "own_ms": own * 1e3, "cum_ms": cum * 1e3}
        )
    return rows


def profile_pretraining(
    config: Path,
    steps: int,
    window: int,
    threads: int = 0,
    prefetch: bool = True,
    deepspeed_clip: bool = False,
    deepspeed_allreduce: bool = False,
) -> dict[str, Any]:
    """Train `steps` steps of CONFIG; profile steps [steps - window, steps)."""
    from torch.profiler import ProfilerActivity, profile, schedule

    from benchmarks.gpu import timing
    from tibnlp.config import load_config
    from tibnlp.training import engine as engine_mod
    from tibnlp.training import loop as loop_mod
    from tibnlp.training.pretrain import run_pretraining

    sets = [f"pretrain.max_steps={steps}"] + ([f"engine.threads={threads}"] if threads else [])
    cfg = load_config(config, sets)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    start = steps - window
    prof = profile(activities=acts, schedule=schedule(wait=start - 1, warmup=1, active=window))
    host = cProfile.Profile()
    step_s: list[float] = []
    wait_s: list[float] = []
    original = loop_mod.TrainLoop.train_step
    busy_ctx = timing.busy_share(device, every_s=0.1)
    busy: dict[str, dict[str, float]] = {}  # the sampler's result, filled in when it stops
    window_open: list[bool] = []

    def close_window() -> None:  # after the last step, or when the run stops inside the window
        if window_open:
            host.disable()
            busy_ctx.__exit__(None, None, None)
            window_open.clear()

    def train_step(self: Any, over: bool) -> Any:
        i = len(step_s)
        if i == start:
            busy["window"] = busy_ctx.__enter__()
            host.enable()
            window_open.append(True)
        feed = self.train_data
        if not getattr(feed, "_timed", False):  # the time the step waits for its batch
            plain = feed.next

            def timed_next() -> Any:
                t0 = time.perf_counter()
                out = plain()
                wait_s.append(time.perf_counter() - t0)
                return out

            feed.next, feed._timed = timed_next, True
        timing.sync(device)
        t0 = time.perf_counter()
        out = original(self, over)
        timing.sync(device)
        step_s.append(time.perf_counter() - t0)
        if i == steps - 1:
            close_window()
        prof.step()
        return out

    prefetched, use_fused_clip = loop_mod.Prefetched, engine_mod.use_fused_clip
    skip_allreduce = engine_mod.skip_lone_allreduce
    loop_mod.TrainLoop.train_step = train_step  # type: ignore[method-assign]
    if not prefetch:
        loop_mod.Prefetched = lambda source, pin: source  # type: ignore[assignment,misc]
    if deepspeed_clip:  # the engine keeps DeepSpeed's own clip_fp32_gradients
        engine_mod.use_fused_clip = lambda ds_engine, world_size: None
    if deepspeed_allreduce:  # the engine all-reduces over its world of one, as DeepSpeed does
        engine_mod.skip_lone_allreduce = lambda ds_engine: None
    try:
        with prof:
            run_pretraining(cfg)
    finally:
        loop_mod.TrainLoop.train_step = original  # type: ignore[method-assign]
        loop_mod.Prefetched = prefetched  # type: ignore[misc]
        engine_mod.use_fused_clip = use_fused_clip
        engine_mod.skip_lone_allreduce = skip_allreduce
        close_window()
    window_steps, window_wait = step_s[start:], wait_s[start:]
    tokens = cfg.pretrain.batch_size * cfg.pretrain.seq_len
    step_ms = statistics.median(window_steps) * 1e3
    return {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "threads": torch.get_num_threads(),
        "prefetch": prefetch,
        "deepspeed_clip": deepspeed_clip,
        "deepspeed_allreduce": deepspeed_allreduce,
        "batch_size": cfg.pretrain.batch_size,
        "seq_len": cfg.pretrain.seq_len,
        "compile": cfg.engine.compile,
        "zero_stage": cfg.engine.zero_stage,
        "steps": len(step_s),
        "window": len(window_steps),
        "step_ms_median": step_ms,
        "wait_ms_median": statistics.median(window_wait) * 1e3 if window_wait else float("nan"),
        "tokens_per_s_at_full_rows": tokens / (step_ms / 1e3),
        "gpu_busy": busy.get("window", {}).get("busy", float("nan")),
        "ops_by_cpu": _top_ops(prof, "self_cpu_time_total"),
        "ops_by_device": _top_ops(prof, "self_device_time_total") if device == "cuda" else [],
        "python": _top_python(host),
    }


def markdown(r: dict[str, Any]) -> str:
    lines = [
        f"{r['device']}, batch {r['batch_size']} x {r['seq_len']}, {r['threads']} intra-op "
        f"threads, prefetch "
        f"{'on' if r['prefetch'] else 'off'}: {r['steps']} steps, window of the last "
        f"{r['window']}: step "
        f"{r['step_ms_median']:.1f} ms (median, synchronised), of which waiting for the batch "
        f"{r['wait_ms_median']:.1f} ms; {r['tokens_per_s_at_full_rows']:,.0f} tokens/s at full "
        f"rows; GPU busy (NVML) {100 * r['gpu_busy']:.0f}%.",
    ]
    for title, key, unit in (
        ("Operators by self CPU time (window)", "ops_by_cpu", "ms"),
        ("Operators by self device time (window)", "ops_by_device", "ms"),
    ):
        if r[key]:
            lines += ["", f"{title}:", "", "| op | calls | ms |", "|---|---:|---:|"]
            lines += [f"| `{o['op']}` | {o['calls']} | {o[unit]:.1f} |" for o in r[key]]
    lines += ["", "Python, own time (window):", "", "| function | calls | own ms | cum ms |"]
    lines.append("|---|---:|---:|---:|")
    lines += [
        f"| `{p['function']}` | {p['calls']} | {p['own_ms']:.1f} | {p['cum_ms']:.1f} |"
        for p in r["python"]
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu.loopprof")
    ap.add_argument("config", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--window", type=int, default=30)
    ap.add_argument("--threads", type=int, default=0, help="engine.threads (0: the config's)")
    ap.add_argument("--no-prefetch", action="store_true")
    ap.add_argument("--deepspeed-clip", action="store_true", help="DeepSpeed's clipping loop")
    ap.add_argument(
        "--deepspeed-allreduce", action="store_true", help="all-reduce in a world of one"
    )
    args = ap.parse_args(argv)
    if not 2 <= args.window < args.steps:
        raise SystemExit("loopprof: need 2 <= --window < --steps")
    result = profile_pretraining(
        args.config,
        args.steps,
        args.window,
        args.threads,
        not args.no_prefetch,
        args.deepspeed_clip,
        args.deepspeed_allreduce,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "loop.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "loop.md").write_text(markdown(result) + "\n")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
