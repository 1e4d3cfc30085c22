"""Training throughput and peak memory: our AlbertForPretraining vs Hugging Face's.

Identical shape (vocab 30000, E=128, D=384, 4 shared layers, 12 heads, FFN 1536, MLM + SOP),
identical batches (fully packed sequences, 15% MLM targets), AdamW, same thread count.
Each variant lives in its own worker process so its peak RSS is its own; the parent runs
them in turn, round after round (alternating), so machine load hits all of them alike.

Rows: transformers in fp32 (its default) and under bf16 autocast (like-for-like with ours
in bf16); ours with the full last layer (every position), ours as pretraining runs it (last
layer at masked positions and [CLS] only), and ours under bf16 autocast (what
`engine.precision: bf16` does through DeepSpeed: fp32 weights and AdamW, bf16 matmuls).
Ablations on request (`--variants`): `dense MLM` projects every position onto the vocabulary
(as HF does); `manual attention` replaces fused SDPA by matmul + softmax.

    PYTHONPATH=. nice -n 5 python benchmarks/bench_vs_transformers.py \
        --out benchmarks/results/vs_transformers.md
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import platform
import statistics
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from benchmarks.gpu.speed import SpeedSettings, build_model, random_batch
from tibnlp.errors import run_script
from tibnlp.fsutil import atomic_write_text

VARIANTS = [
    "transformers",
    "transformers, bf16 autocast",
    "ours, full last layer",
    "ours",
    "ours, bf16 autocast",
]
ABLATIONS = ["ours, dense MLM", "ours, manual attention"]
BASELINES = ("transformers", "transformers, bf16 autocast")
SHAPE = SpeedSettings("cpu")  # the GPU speed block's shape: ALBERT-tiny, vocabulary 30000
SHAPES = [(128, 32), (512, 8)]  # (seq, batch) of the table


def _build(variant: str, shape: SpeedSettings) -> Any:
    import torch
    import torch.nn.functional as F

    if variant.startswith("transformers"):
        return build_model(variant, shape)
    from tibnlp.models.attention import AttentionCore

    model = build_model("ours", shape, sparse_last_layer=variant != "ours, full last layer")
    if variant == "ours, manual attention":

        class ManualCore(AttentionCore):
            def forward(self, q, k, v, ctx):  # type: ignore[no-untyped-def, override]
                s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
                s = s.masked_fill(~ctx.attention_mask[:, None, None, :], float("-inf"))
                return torch.softmax(s, -1) @ v

        model.encoder.layer.attention.route(shape.heads).core = ManualCore(shape.heads)
    if variant == "ours, dense MLM":
        original = model.forward

        def dense_mlm(input_ids, attention_mask, token_type_ids, mlm_labels, sop_labels):  # type: ignore[no-untyped-def]
            out = original(input_ids, attention_mask, token_type_ids, mlm_labels, sop_labels)
            h = model.encoder(input_ids, attention_mask, token_type_ids).hidden
            z = model.mlm_norm(F.gelu(model.mlm_dense(h)))
            logits = F.linear(z, model.encoder.embeddings.word.weight, model.mlm_bias)
            mlm = F.cross_entropy(logits.flatten(0, 1), mlm_labels.flatten(), ignore_index=-100)
            out["loss"] = mlm + out["sop_loss"]
            return out

        model.forward = dense_mlm  # type: ignore[method-assign]
    return model


def _worker(
    variant: str, shape: SpeedSettings, batch: int, seq: int, threads: int, conn: Connection
) -> None:
    import resource

    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = _build(variant, shape).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = random_batch(shape, batch, seq)
    ids, mask, types, labels, sop = x["ids"], x["mask"], x["types"], x["labels"], x["sop"]
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    bf16 = variant.endswith("bf16 autocast")

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            out = forward()
        out["loss"].backward()
        opt.step()

    def forward() -> Any:
        if variant.startswith("transformers"):
            return model(
                input_ids=ids,
                attention_mask=mask,
                token_type_ids=types,
                labels=labels,
                sentence_order_label=sop,
            )
        return model(ids, mask, types, labels, sop)

    step()  # warm-up (allocator, AdamW state)
    conn.send(("ready", rss0))
    while True:
        steps = conn.recv()
        if steps is None:
            break
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        dt = time.perf_counter() - t0
        conn.send((steps * batch * seq / dt, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))
    conn.close()


def run_shape(
    variants: list[str],
    batch: int,
    seq: int,
    rounds: int,
    steps: int,
    threads: int,
    shape: SpeedSettings = SHAPE,
) -> dict[str, Any]:
    ctx = mp.get_context("fork")
    workers = {}
    for v in variants:
        parent, child = ctx.Pipe()
        work = (v, shape, batch, seq, threads, child)
        p = ctx.Process(target=_worker, args=work, daemon=True)
        p.start()
        workers[v] = (p, parent)
    base = {v: conn.recv()[1] for v, (_, conn) in workers.items()}
    rates: dict[str, list[float]] = {v: [] for v in variants}
    peak = dict(base)
    for _ in range(rounds):
        for v, (_, conn) in workers.items():
            conn.send(steps)
            rate, rss = conn.recv()
            rates[v].append(rate)
            peak[v] = rss
            print(f"  N={seq} b={batch} {v}: {rate:.0f} tokens/s", flush=True)
    for p, conn in workers.values():
        conn.send(None)
        p.join()
    return {"rates": rates, "peak_kib": peak, "base_kib": base}


def _uptime() -> str:
    """`uptime`'s load averages (1, 5, 15 min), as the results file records them."""
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--variants", default=";".join(VARIANTS), help=f"separated by ;, also {ABLATIONS}"
    )
    ap.add_argument(
        "--tiny",
        action="store_true",
        help="the GPU speed block's toy model and shapes (SpeedSettings.tiny): a smoke run",
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    variants = [v.strip() for v in args.variants.split(";")]
    unknown = set(variants) - set(VARIANTS + ABLATIONS)
    if unknown or not set(BASELINES) <= set(variants):
        ap.error(f"unknown variants {sorted(unknown)} or a baseline {BASELINES} missing")
    shape = SpeedSettings.tiny() if args.tiny else SHAPE
    shapes = [(s, b) for s, b in shape.shapes] if args.tiny else SHAPES
    load0, t0 = _uptime(), time.time()
    results = {
        (s, b): run_shape(variants, b, s, args.rounds, args.steps, args.threads, shape)
        for s, b in shapes
    }
    load1, minutes = _uptime(), (time.time() - t0) / 60
    import torch
    import transformers

    lines = [
        "# Pretraining throughput: tibnlp AlbertForPretraining vs transformers "
        "AlbertForPreTraining",
        "",
        f"`PYTHONPATH=. nice -n 5 python benchmarks/bench_vs_transformers.py --rounds "
        f"{args.rounds} --steps {args.steps} --threads {args.threads}"
        + (" --tiny`" if args.tiny else "`"),
        "",
        f"torch {torch.__version__}, transformers {transformers.__version__}, CPU "
        f"({platform.machine()}, {os.cpu_count()} cores, "
        f"{'AMX-BF16' if torch.cpu.get_capabilities().get('amx_bf16') else 'no AMX'}), "
        f"{args.threads} threads per model, AdamW, {minutes:.0f} min. Load averages (1, 5, "
        f"15 min) {load0} at start and {load1} at end: the machine was shared with other "
        "jobs, so absolute tokens/s are depressed and noisy; the variants ran alternately "
        "(one at a time, round after round) so ratios are comparable.",
        "",
        f"Shape: vocab {shape.vocab}, E={shape.emb}, D={shape.hidden}, {shape.layers} shared "
        f"layers, {shape.heads} heads, FFN {shape.ffn}, MLM + SOP, dropout 0 in both "
        "(ALBERT's setting). Batches are fully packed (no padding), 15% MLM targets. bf16 "
        "rows: forward under `torch.autocast('cpu', torch.bfloat16)`, fp32 "
        "weights and AdamW. Tokens/s: median over rounds; peak RSS: each variant's own worker "
        "process (max resident set, includes the Python/torch runtime; 'training' is the "
        "growth over the RSS before the first training step).",
        "",
        "| seq | batch | variant | tokens/s (median) | vs transformers fp32 | "
        "vs transformers bf16 | peak RSS MiB | training MiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (s, b), r in results.items():
        hf32, hf16 = (statistics.median(r["rates"][v]) for v in BASELINES)
        for v in variants:
            med = statistics.median(r["rates"][v])
            peak = r["peak_kib"][v] / 1024
            grow = (r["peak_kib"][v] - r["base_kib"][v]) / 1024
            lines.append(
                f"| {s} | {b} | {v} | {med:,.0f} | {med / hf32:.2f}x | {med / hf16:.2f}x | "
                f"{peak:,.0f} | {grow:,.0f} |"
            )
    lines += ["", "Per-round tokens/s (alternating order):", ""]
    for (s, b), r in results.items():
        for v in variants:
            rounds = ", ".join(f"{x:,.0f}" for x in r["rates"][v])
            lines.append(f"- {s}/b{b} {v}: {rounds}")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        atomic_write_text(args.out, text)


if __name__ == "__main__":
    run_script(main)
