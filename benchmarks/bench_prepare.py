"""Corpus preparation throughput with 1 and 2 processes, side by side in one run.

Prepares the full raw corpus of the data directory (`corpora/*.txt.xz`, about 178 MB of
UTF-8 text) once per process count, into temporary directories, and writes MB/s (of
uncompressed input text) and the speed-up ratio to benchmarks/results/prepare.md.

    python benchmarks/bench_prepare.py [--procs 1 2] [--repeat 1] [--output FILE] \
        [--inputs PATH ...]

`--inputs` (files or folders) replaces the full corpus, e.g. by a small file for a smoke run.

Runs alternate (1, 2, 1, 2, ...) so that a change in machine load hits both settings alike.
The load average before and after each run is recorded: on a shared machine the absolute
figures move, the ratio is what to compare.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from tibnlp.config import CorpusConfig
from tibnlp.data.datadir import require
from tibnlp.errors import run_script
from tibnlp.fsutil import atomic_write_text
from tibnlp.text.input_files import expand_inputs
from tibnlp.text.prepare import prepare_corpus

RESULTS = Path(__file__).parent / "results" / "prepare.md"


def _cpu_seconds() -> float:
    """CPU time (user + system) of this process and its finished children (map workers)."""
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _run(files: list[Path], procs: int, workdir: Path) -> dict[str, object]:
    load_before = os.getloadavg()[0]
    cpu_before = _cpu_seconds()
    started = time.perf_counter()
    report = prepare_corpus(
        files, workdir / f"out-{procs}", CorpusConfig(num_proc=procs), progress=False
    )
    seconds = time.perf_counter() - started
    return {
        "procs": procs,
        "seconds": seconds,
        "cpu_seconds": _cpu_seconds() - cpu_before,
        "mb_per_s": report["text_bytes"] / seconds / 1e6,
        "steps": report["seconds_by_step"],
        "load": (load_before, os.getloadavg()[0]),
        "report": report,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument(
        "--inputs", type=Path, nargs="+", help="raw text files or folders (default: the corpus)"
    )
    args = parser.parse_args()

    if args.inputs:
        files = expand_inputs(args.inputs)
    else:
        files = sorted(require("corpora", "the raw corpus").glob("*.txt.xz"))
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-prepare-") as tmp:
        for r in range(args.repeat):
            for procs in args.procs:
                workdir = Path(tmp) / f"r{r}"
                workdir.mkdir(exist_ok=True)
                run = _run(files, procs, workdir)
                print(
                    f"procs={procs} {run['seconds']:.1f} s (cpu {run['cpu_seconds']:.1f} s) "
                    f"{run['mb_per_s']:.2f} MB/s "
                    f"steps={run['steps']} load={run['load']}",
                    flush=True,
                )
                runs.append(run)
    totals = {str(run["report"]["total"]) for run in runs}  # type: ignore[index]
    assert len(totals) == 1, f"process counts disagree on the result: {totals}"
    _write(args.output, files, runs, "`corpora/*.txt.xz`" if not args.inputs else "given")


def _write(path: Path, files: list[Path], runs: list[dict], named: str) -> None:
    report = runs[0]["report"]
    best = {
        p: min(r["seconds"] for r in runs if r["procs"] == p) for p in {r["procs"] for r in runs}
    }
    base = best[min(best)]
    lines = [
        "# Corpus preparation throughput (`tibnlp corpus prepare`)",
        "",
        f"Measured {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC by "
        f"`benchmarks/bench_prepare.py` on {platform.machine()}, {os.cpu_count()} CPU cores, "
        f"Python {platform.python_version()}.",
        "",
        "**The machine was shared**: other jobs were running at the same time (see the load "
        "average per run; the machine has only "
        f"{os.cpu_count()} cores). Absolute MB/s are therefore pessimistic and noisy; the "
        "runs alternate between settings so the ratio is the figure to compare. CPU s (user + "
        "system of the run and its worker processes) shows the work done, independent of how "
        "much of the cores the run was given; cores used = CPU s / wall s. When 2 processes "
        "use no more cores than 1, the machine gave the run no more CPU and the wall-time "
        "ratio measures the contention, not the parallel speed-up.",
        "",
        f"Input: {len(files)} files {named}, {report['text_bytes'] / 1e6:.1f} MB of "
        f"UTF-8 text ({sum(f.stat().st_size for f in files) / 1e6:.1f} MB compressed). "
        "Default `CorpusConfig` apart from `num_proc`. "
        "MB/s = uncompressed input bytes / wall time.",
        "",
        "| run | processes | wall s | CPU s | cores used | MB/s | read s | map s "
        "| dedup+split+write s | load avg before/after |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for i, run in enumerate(runs, 1):
        steps = run["steps"]
        lines.append(
            f"| {i} | {run['procs']} | {run['seconds']:.1f} | {run['cpu_seconds']:.1f} | "
            f"{run['cpu_seconds'] / run['seconds']:.2f} | {run['mb_per_s']:.2f} | "
            f"{steps['read']:.1f} | {steps['process']:.1f} | {steps['dedup_split_write']:.1f} | "
            f"{run['load'][0]:.1f} / {run['load'][1]:.1f} |"
        )
    lines += ["", "Best wall time per setting and speed-up over the fewest processes:", ""]
    lines += ["| processes | best wall s | MB/s | speed-up |", "|---:|---:|---:|---:|"]
    for procs, seconds in sorted(best.items()):
        lines.append(
            f"| {procs} | {seconds:.1f} | {report['text_bytes'] / seconds / 1e6:.2f} | "
            f"{base / seconds:.2f}x |"
        )
    total = report["total"]
    lines += [
        "",
        "Only the per-document step (normalise, filter, split: one forked process per shard, "
        "`tibnlp.text.process_map`) runs in parallel; reading/decompressing the inputs and the "
        "corpus-wide dedup, held-out split and write are serial, which bounds the speed-up "
        "(Amdahl).",
        "",
        f"Result (identical for every setting): {total['documents']:,} documents, "
        f"{total['sentences']:,} sentences, {total['syllables']:,} syllables, "
        f"{total['characters']:,} characters; {report['dropped_sentences']['duplicate']:,} "
        "duplicate sentences dropped.",
        "",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "\n".join(lines))
    print(f"wrote {path}")


if __name__ == "__main__":
    run_script(main)
