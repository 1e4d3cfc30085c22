"""Where one pretraining step spends its time on this CPU: matrix work vs everything else.

Profiles full optimizer steps (forward, backward, AdamW) of `AlbertForPretraining` at a given
shape with torch.profiler, and groups self CPU time by operator into matrix products (mm,
addmm, bmm, linear, SDPA and its backward), elementwise/normalisation, indexing/embedding,
optimizer, and the rest. Inputs are fully packed random token ids with `mask_prob` MLM
targets: the profile depends on shapes, not on the text. A step that is mostly matrix work
cannot be made much faster at the same shape and precision; what is left over is the target.

    PYTHONPATH=. nice -n 5 python benchmarks/bench_step_profile.py \
        --out benchmarks/results/step_profile.md
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from tibnlp.config.model import HeadsConfig, ModelConfig
from tibnlp.data.masking import IGNORE_INDEX as IGNORE
from tibnlp.errors import run_script
from tibnlp.fsutil import atomic_write_text
from tibnlp.models.pretraining import AlbertForPretraining
from tibnlp.models.summary import training_flops_per_token
from tibnlp.training.engine import hardware_name

GROUPS = {
    "matrix": ("mm", "addmm", "bmm", "linear", "matmul", "scaled_dot_product", "_flash", "baddbmm"),
    "optimizer": ("adam", "_foreach", "lerp", "addcdiv", "addcmul", "sqrt"),
    "normalisation/activation": ("layer_norm", "gelu", "softmax", "tanh", "dropout"),
    "indexing/embedding": ("embedding", "index", "gather", "scatter", "masked", "nonzero", "where"),
    "loss": ("cross_entropy", "nll_loss", "log_softmax"),
}


def group_of(name: str) -> str:
    low = name.lower()
    for group, keys in GROUPS.items():
        if any(k in low for k in keys):
            return group
    return "other (copies, adds, casts, autograd glue)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=14245)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--emb", type=int, default=128)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--mask-prob", type=float, default=0.3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=args.vocab,
        embedding_size=args.emb,
        hidden_size=args.hidden,
        num_layers=args.layers,
        ffn_size=args.ffn,
        max_len=args.seq,
        dropout=0.0,
        attention_dropout=0.0,
        norm="pre",
        heads=HeadsConfig(small=args.heads, large=args.heads),
    )
    model = AlbertForPretraining(cfg, sparse_last_layer=True, sop=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(5, args.vocab, (args.batch, args.seq))
    labels = torch.full_like(ids, IGNORE)
    sel = torch.rand(ids.shape) < args.mask_prob
    labels[sel] = ids[sel]
    mask = torch.ones_like(ids)

    def step() -> None:
        out = model(ids, mask, None, labels)
        out["loss"].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # warm-up: allocator, first-call dispatch
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            step()
    by_group: dict[str, float] = defaultdict(float)
    by_op: dict[str, float] = defaultdict(float)
    for evt in prof.key_averages():
        by_group[group_of(evt.key)] += evt.self_cpu_time_total
        by_op[evt.key] += evt.self_cpu_time_total
    total = sum(by_group.values())
    step_s = total / 1e6 / args.steps
    tokens = args.batch * args.seq
    flops = training_flops_per_token(cfg, args.seq, args.mask_prob) * tokens
    lines = [
        "# One pretraining step, profiled",
        "",
        f"CPU: {hardware_name()}, {args.threads} threads, torch {torch.__version__}, fp32.",
        f"Shape: vocab {args.vocab}, E={args.emb}, D={args.hidden}, {args.layers} layers, "
        f"{args.heads} heads, FFN {args.ffn}, pre-LN, sparse MLM (mask {args.mask_prob}), "
        f"seq {args.seq}, batch {args.batch}, AdamW; {args.steps} profiled steps.",
        f"Step (sum of self CPU time): {step_s:.3f} s, {tokens / step_s:,.0f} tokens/s, "
        f"{flops / step_s / 1e9:.0f} GFLOP/s of analytic model compute.",
        "",
        "| group | share of self CPU time |",
        "|---|---|",
    ]
    for group, t in sorted(by_group.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {group} | {t / total:.1%} |")
    lines += ["", "| top operators | share |", "|---|---|"]
    for op, t in sorted(by_op.items(), key=lambda kv: -kv[1])[:15]:
        lines.append(f"| `{op}` | {t / total:.1%} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        atomic_write_text(args.out, text)


if __name__ == "__main__":
    run_script(main)
