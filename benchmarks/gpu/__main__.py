"""`python -m benchmarks.gpu bundle | run PART... [--cpu] | collect DIR` (see __init__)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

PARTS = ("check", "speed", "pretrain", "curve", "wide", "loop", "finetune")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu")
    sub = ap.add_subparsers(dest="verb", required=True)
    b = sub.add_parser("bundle", help="here: wheels + data into .bundle/, size checked")
    b.add_argument("--data", type=Path, default=None, help="default: $TIBNLP_DATA")
    r = sub.add_parser("run", help="on the device (or --cpu here): one or more parts")
    r.add_argument("parts", nargs="+", choices=list(PARTS))
    r.add_argument("--cpu", action="store_true", help="toy sizes on the CPU (the suite's test)")
    r.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".gpu-run/out")))
    r.add_argument("--work", type=Path, default=Path(".gpu-run"))
    r.add_argument("--minutes", type=float, default=5.0, help="pretraining budget (device)")
    r.add_argument("--tokens", type=float, default=60e6, help="curve: corpus-stage tokens")
    r.add_argument("--compile", choices=["none", "ours", "all"], default="ours", help="speed")
    r.add_argument(
        "--blocks",
        default="",
        help="speed: some of models,layers,compiled-models,compiled-layers,compiled-tiles (all)",
    )
    r.add_argument("--pack", type=Path, default=None, help="few files: reports.tar + parts")
    r.add_argument("--variants", default="", help="loop: variants by index, e.g. 0,3 (all)")
    r.add_argument(
        "--set",
        action="append",
        default=[],
        help="pretrain, curve, wide, finetune: a config or pipeline override (KEY=VALUE)",
    )
    r.add_argument("--until", default="", help="wide: the last pipeline stage run (all)")
    r.add_argument("--runs", default="", help="finetune: runs by name, e.g. tncc-title (all)")
    c = sub.add_parser("collect", help="here: the returned sections into results/gpu.md")
    c.add_argument("folder", type=Path)
    args = ap.parse_args(argv)
    if args.verb == "bundle":
        from benchmarks.gpu import bundle
        from tibnlp.data.datadir import data_dir

        return bundle.main(args.data or data_dir())
    if args.verb == "collect":
        from benchmarks.gpu import results

        print("updated:", ", ".join(results.collect(args.folder)))
        return 0
    from benchmarks.gpu.run import Mode, run

    mode = Mode(args.cpu, args.out.resolve(), args.work.resolve(), args.minutes)
    mode.tokens, mode.compile = args.tokens, args.compile
    mode.blocks = tuple(b for b in args.blocks.split(",") if b)
    mode.pack = args.pack.resolve() if args.pack else None
    mode.variants, mode.sets, mode.until = args.variants, list(args.set), args.until
    mode.runs = args.runs
    return 1 if run(args.parts, mode) else 0


if __name__ == "__main__":
    sys.exit(main())
