"""Vocabulary build at 30000 on a prepared corpus: wall time and peak memory (RSS).

SentencePiece trains in C++, so tracemalloc would miss it: the build runs as a child process
(`tibnlp vocab build`) and its peak resident set is the children's `ru_maxrss`. Each setting
runs in its own child, one after the other, so the figures sit side by side.

    python benchmarks/bench_vocab.py --corpus DIR --out-root DIR \
        [--runs true:16000,false:16000,false:30000]   # split_on_tsheg:vocab_size[:OPTIONS]

OPTIONS: vocab switches turned on, joined by `+` (`true:16000:whole_units+punctuation_pieces`).

Outputs go to OUT_ROOT/vocab-<split|nosplit>-<size>.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tibnlp.errors import run_script
from tibnlp.fsutil import atomic_write_text

SWITCHES = ("whole_units", "punctuation_pieces")
ROOT = Path(__file__).resolve().parents[1]


def build(
    corpus: Path, output: Path, vocab_size: int, split: bool, switches: list[str]
) -> dict[str, object]:
    cmd = [
        sys.executable,
        "-m",
        "tibnlp.cli.main",
        "vocab",
        "build",
        "--corpus",
        str(corpus),
        "--output",
        str(output),
        "--vocab-size",
        str(vocab_size),
        "--set",
        f"vocab.split_on_tsheg={'true' if split else 'false'}",
        *(a for name in switches for a in ("--set", f"vocab.{name}=true")),
    ]
    start = time.perf_counter()
    # the build imports the tibnlp this script sits in, from whatever directory it runs
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)})
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"build failed ({status}): {' '.join(cmd)}")
    report = json.loads((output / "report.json").read_text(encoding="utf-8"))
    return {
        "split_on_tsheg": split,
        "wall_s": round(wall, 1),
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),  # Linux: KiB
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        **{k: v for k, v in report.items() if k != "longest_pieces"},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--out-root", type=Path, required=True)
    parser.add_argument("--runs", default="true:16000,false:16000,false:30000")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    for run in args.runs.split(","):
        split_text, size_text, *rest = run.split(":")
        switches = rest[0].split("+") if rest else []
        if unknown := [s for s in switches if s not in SWITCHES]:
            raise SystemExit(f"--runs {run}: unknown switch {unknown[0]} (known: {SWITCHES})")
        split = split_text == "true"
        name = "-".join(["vocab", "split" if split else "nosplit", size_text, *switches])
        rows.append(build(args.corpus, args.out_root / name, int(size_text), split, switches))
        print(json.dumps(rows[-1]), flush=True)  # kept even if a later run is stopped
    text = json.dumps({"cpus": os.cpu_count(), "load": os.getloadavg(), "runs": rows}, indent=2)
    print(text)
    if args.json:
        atomic_write_text(args.json, text)


if __name__ == "__main__":
    run_script(main)
