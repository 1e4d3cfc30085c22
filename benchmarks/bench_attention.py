"""Forward+backward time of one shared layer: multi-scale vs dense, dynamic vs fixed heads.

All variants run side by side in one process, interleaved round by round, and the table
reports medians and ratios to the dense fixed-head layer (absolute times drift on a shared
machine; ratios measured in one run do not). Three granularities are timed because they
answer different questions: the attention core alone (what windowing saves), the attention
module with its projections, and the whole ALBERT layer (with FFN, or the paper's FFN-free
layer). A multi-scale row is averaged over the L layer-specific head distributions.

    PYTHONPATH=. python benchmarks/bench_attention.py --out benchmarks/results/attention.md
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import torch

from tibnlp.config.model import PAPER_WINDOWS, HeadsConfig, ModelConfig, ScalesConfig
from tibnlp.errors import run_script
from tibnlp.fsutil import atomic_write_text
from tibnlp.models.attention import AttentionContext, choose_large
from tibnlp.models.encoder import SharedLayer

WINDOWS = list(PAPER_WINDOWS)
SHAPES = [(128, 16), (512, 4)]  # (N, batch): the shapes of benchmarks/results/attention.md


def shape_list(text: str) -> list[tuple[int, int]]:
    """`--shapes 128:16,512:4` -> [(128, 16), (512, 4)]."""
    try:
        shapes = [(int(n), int(b)) for n, b in (item.split(":") for item in text.split(","))]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected N:batch pairs, e.g. 128:16") from None
    if any(n < 4 or b < 2 for n, b in shapes):
        raise argparse.ArgumentTypeError(f"{text!r}: N must be at least 4 and batch at least 2")
    return shapes


def make_cfg(
    small: int,
    large: int,
    windows: list[str],
    ffn: bool = True,
    rule: Literal["batch", "sentence"] = "batch",
    threshold: int = 64,
) -> ModelConfig:
    return ModelConfig(
        dropout=0.0,
        attention_dropout=0.0,
        heads=HeadsConfig(small=small, large=large, threshold=threshold, rule=rule),
        scales=ScalesConfig(windows=windows, alpha=0.5, ffn=ffn),
    )


def timer(
    cfg: ModelConfig, b: int, n: int, part: str, lengths: torch.Tensor | None = None
) -> Callable[[], float]:
    torch.manual_seed(0)
    layer = SharedLayer(cfg)
    x = torch.randn(b, n, cfg.hidden_size, requires_grad=True)
    lens = lengths if lengths is not None else torch.full((b,), n)
    mask = torch.arange(n)[None, :] < lens[:, None]
    large = choose_large(lens, cfg.heads)
    route = layer.attention.route(cfg.heads.large)
    qkv = torch.randn(3, b, cfg.heads.large, n, cfg.hidden_size // cfg.heads.large)
    qkv.requires_grad_(True)

    def run() -> float:
        t0 = time.perf_counter()
        for layer_idx in range(cfg.num_layers if cfg.scales.enabled else 1):
            ctx = AttentionContext(mask, lens, layer_idx, cfg.num_layers)
            if part == "core":
                y = route.core(qkv[0], qkv[1], qkv[2], ctx)
            elif part == "attention":
                y = layer.attention(x, ctx, large)
            else:
                y = layer(x, ctx, large)
            y.sum().backward()
        reps = cfg.num_layers if cfg.scales.enabled else 1
        return (time.perf_counter() - t0) / reps

    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--shapes",
        type=shape_list,
        default=SHAPES,
        help="N:batch pairs, comma-separated (default 128:16,512:4; small ones for a smoke run)",
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    # One thread by default: on an oversubscribed machine, thread barriers between many small
    # ops add noise that says more about the load than about the kernels.
    torch.set_num_threads(args.threads)
    command = f"--rounds {args.rounds} --threads {args.threads}"
    if args.shapes != SHAPES:
        command += f" --shapes {','.join(f'{n}:{b}' for n, b in args.shapes)}"
    lines = [
        "# Attention benchmark: one layer, forward + backward (CPU)",
        "",
        f"`PYTHONPATH=. python benchmarks/bench_attention.py {command}`; "
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {platform.machine()}"
        f" ({os.cpu_count()} cores), load average at start {os.getloadavg()[0]:.1f} "
        "(machine shared with other jobs: "
        "absolute times are noisy, ratios were measured interleaved in one run).",
        "",
        "D=384, FFN 1536, fp32, dropout off. Multi-scale: windows "
        f"{WINDOWS}, alpha 0.5, 12 heads; each time is the mean over the 4 layer distributions.",
        "Dynamic: heads (8, 12), batch rule, full-length batch (takes the 12-head route); "
        "'mixed' is the sentence rule (threshold N/4) on a batch whose first half is a quarter "
        "as long: that half takes the 8-head route, the rest the 12-head one.",
        "",
        "| N | batch | part | variant | median ms | ratio to dense h=12 |",
        "|---|---|---|---|---|---|",
    ]
    for n, b in args.shapes:
        half = torch.tensor([n // 4] * (b // 2) + [n] * (b - b // 2))
        variants: dict[tuple[str, str], Callable[[], float]] = {}
        for part in ("core", "attention", "layer"):
            variants[(part, "dense h=12")] = timer(make_cfg(12, 12, []), b, n, part)
            variants[(part, "multi-scale h=12")] = timer(make_cfg(12, 12, WINDOWS), b, n, part)
        variants[("layer", "multi-scale h=12, FFN-free")] = timer(
            make_cfg(12, 12, WINDOWS, ffn=False), b, n, "layer"
        )
        for part in ("attention", "layer"):
            # A second, identical dense layer: its ratio is the noise floor of this run.
            variants[(part, "dense h=12 again (control)")] = timer(make_cfg(12, 12, []), b, n, part)
            variants[(part, "dynamic (8,12) batch rule")] = timer(make_cfg(8, 12, []), b, n, part)
            # threshold N/4: the short half takes the 8-head route, the long half the 12
            mixed = make_cfg(8, 12, [], rule="sentence", threshold=n // 4)
            variants[(part, "dynamic (8,12) sentence rule, mixed")] = timer(
                mixed, b, n, part, lengths=half
            )
        times: dict[tuple[str, str], list[float]] = {k: [] for k in variants}
        for f in variants.values():
            f()  # warm-up
        for _ in range(args.rounds):
            for key, f in variants.items():
                times[key].append(f())
        for part in ("core", "attention", "layer"):
            base = statistics.median(times[(part, "dense h=12")])
            for (p, name), ts in times.items():
                if p != part:
                    continue
                med = statistics.median(ts)
                lines.append(
                    f"| {n} | {b} | {part} | {name} | {med * 1e3:.1f} | {med / base:.2f} |"
                )
        print("\n".join(lines), flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        atomic_write_text(args.out, text)
    print(text)


if __name__ == "__main__":
    run_script(main)
