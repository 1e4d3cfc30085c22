"""Whole-word masking: what botok segmentation costs, and what the masks look like.

    python benchmarks/bench_words.py --words-corpus DIR --vocab DIR [--full DIR]
        [--sample-chars 200000] [--no-sample --full-syllables N] [--output FILE]

1. Segmentation cost per source: the first `--sample-chars` characters of every source of a
   prepared full corpus (`--full`; default: the data directory's `corpora/*.txt.xz` prepared
   into a temporary folder) are segmented in this process with one `WordSegmenter`; CPU time
   (load-independent) and wall time give characters/s and syllables/s, which extrapolate to
   each source's syllables in the full corpus: CPU-hours, and wall time on N dedicated cores.
   `--no-sample` skips this (it prepares the full corpus: long on a loaded machine) and
   extrapolates the measured run's CPU rate to `--full-syllables` instead.
2. The measured run: `--words-corpus` is a corpus whose words were found by `tibnlp corpus
   words` / `corpus.words: true`; its words/.words-run.json holds that run's wall and CPU
   seconds (words/meta.json only what the words are).
3. Masks on the first `--mask-docs` documents of that corpus (segmented again, in a temporary
   copy) with `--vocab`: whole-word vs span masking rate (pieces masked / real pieces),
   pieces per syllable and per word, and how many words span masking cuts.

Writes benchmarks/results/wwm.md with the CPU model and the load average (a shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tibnlp.config import CorpusConfig
from tibnlp.data.datadir import require
from tibnlp.data.masking import IGNORE_INDEX, MlmCollator
from tibnlp.data.pretraining import build_pretraining_dataset, load_pretraining_dataset
from tibnlp.errors import DataError, run_script
from tibnlp.fsutil import atomic_write_text
from tibnlp.text.corpus_words import META_FILE, RUN_FILE, WORDS_DIR, segment_corpus
from tibnlp.text.normalize import normalize
from tibnlp.text.prepare import load_prepared, prepare_corpus
from tibnlp.text.syllables import count_syllables
from tibnlp.text.vocab import Vocabulary
from tibnlp.text.words import WordSegmenter

RESULTS = Path(__file__).parent / "results" / "wwm.md"


def cpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
        if line.startswith("Model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def sample_cost(corpus_dir: Path, sample_chars: int) -> list[dict[str, Any]]:
    """Per source: characters, syllables, CPU and wall seconds of segmenting a sample."""
    corpus = load_prepared(corpus_dir)
    seg = WordSegmenter()
    texts: dict[str, list[str]] = {}
    sizes: dict[str, int] = {}
    for row in corpus["train"].select_columns(["source", "sentences"]):
        source = row["source"]
        if sizes.get(source, 0) >= sample_chars:
            continue
        for sentence in row["sentences"]:
            texts.setdefault(source, []).append(normalize(sentence))
            sizes[source] = sizes.get(source, 0) + len(sentence)
    rows = []
    for source, sentences in sorted(texts.items()):
        load = os.getloadavg()[0]
        wall, cpu = time.perf_counter(), time.process_time()
        words = sum(seg.segment(s)[1] for s in sentences)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        rows.append(
            {
                "source": source,
                "characters": sum(len(s) for s in sentences),
                "syllables": sum(count_syllables(s) for s in sentences),
                "words": words,
                "cpu": cpu,
                "wall": wall,
                "load": load,
            }
        )
        print(f"{source}: {rows[-1]}", flush=True)
    return rows


def mask_stats(corpus_dir: Path, vocab_dir: Path, docs: int, seq_len: int) -> dict[str, Any]:
    """Masking rates and word statistics on the first `docs` training documents."""
    import datasets

    vocab = Vocabulary.load(vocab_dir)
    corpus = load_prepared(corpus_dir)
    with tempfile.TemporaryDirectory(prefix="bench-wwm-") as tmp:
        sub = Path(tmp) / "corpus"
        datasets.DatasetDict(
            train=corpus["train"].select(range(docs)), heldout=corpus["heldout"]
        ).save_to_disk(str(sub / "dataset"))
        for name in ("tibnlp-corpus.json", "report.json"):
            (sub / name).write_bytes((corpus_dir / name).read_bytes())
        segment_corpus(sub, progress=None)  # the same words as the stored ones
        out = build_pretraining_dataset(
            sub, vocab, seq_len, Path(tmp) / "data", masking="whole_word"
        )
        ds, _ = load_pretraining_dataset(out)
        examples = [ds["train"][i] for i in range(len(ds["train"]))]
    special = vocab.special_ids
    real = sum(i not in special for ex in examples for i in ex["input_ids"])
    stats: dict[str, Any] = {
        "examples": len(examples),
        "pieces": real,
        "syllables": sum(
            s and i not in special
            for ex in examples
            for s, i in zip(ex["syllable_start"], ex["input_ids"], strict=True)
        ),
        "words": sum(
            w and i not in special
            for ex in examples
            for w, i in zip(ex["word_start"], ex["input_ids"], strict=True)
        ),
    }
    batches = 50
    for whole_word in (False, True):
        collator = MlmCollator(vocab, 0.15, 3, 1, whole_word=whole_word)
        masked = total = cut = touched = 0
        for b in range(batches):
            batch = random.Random(b).sample(examples, 32)
            labels = collator(batch, b)["mlm_labels"]
            masked += int((labels != IGNORE_INDEX).sum())
            total += sum(i not in special for ex in batch for i in ex["input_ids"])
            for row, ex in enumerate(batch):
                group: list[bool] = []
                for pos, (w, i) in enumerate(zip(ex["word_start"], ex["input_ids"], strict=True)):
                    if i in special or w:
                        if group:
                            touched += any(group)
                            cut += any(group) and not all(group)
                        group = []
                    if i not in special:
                        group.append(bool(labels[row, pos] != IGNORE_INDEX))
                if group:
                    touched += any(group)
                    cut += any(group) and not all(group)
        name = "whole_word" if whole_word else "span"
        stats[name] = {"rate": masked / total, "words_touched": touched, "words_cut": cut}
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--words-corpus", type=Path, required=True)
    parser.add_argument("--vocab", type=Path, required=True)
    parser.add_argument("--full", type=Path, default=None)
    parser.add_argument("--sample-chars", type=int, default=200_000)
    parser.add_argument("--mask-docs", type=int, default=150)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--no-sample", action="store_true")
    parser.add_argument("--full-syllables", type=int, default=0)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    # the inputs read last, checked before the minutes of segmentation that come first
    measured = measured_run(args.words_corpus / WORDS_DIR)
    Vocabulary.load(args.vocab)

    report: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-words-") as tmp:
        full = args.full
        if full is None and not args.no_sample:
            full = Path(tmp) / "full"
            files = sorted(require("corpora", "the raw corpus").glob("*.txt.xz"))
            prepare_corpus(files, full, CorpusConfig(), progress=False)
        if full is not None:
            report = json.loads((full / "report.json").read_text())
            rows = sample_cost(full, args.sample_chars)
    masks = mask_stats(args.words_corpus, args.vocab, args.mask_docs, args.seq_len)
    _write(args, report, rows, measured, masks)


def measured_run(words: Path) -> dict[str, Any]:
    """The figures of a corpus's words (meta.json) with the seconds, processes and shards of
    the run that found them (the hidden run file; words found before it existed kept them
    in meta.json)."""
    meta, run = words / META_FILE, words / RUN_FILE
    if not meta.is_file():
        raise DataError(
            f"{meta} does not exist: --words-corpus is not a corpus prepared with words",
            "prepare one with `tibnlp corpus prepare ... --set corpus.words=true`",
        )
    measured = dict(json.loads(meta.read_text()))
    if run.is_file():
        measured.update(json.loads(run.read_text()))
    if "wall_seconds" not in measured:
        raise DataError(
            f"{run} does not exist: the run that found these words is not recorded",
            f"delete {words} and find them again: tibnlp corpus words {words.parent}",
        )
    return measured


def _write(args: Any, report: dict, rows: list[dict], measured: dict, masks: dict) -> None:
    lines = [
        "# Whole-word masking: botok segmentation cost and masks",
        "",
        f"Measured {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC by `benchmarks/bench_words.py "
        f"--words-corpus {args.words_corpus.name} --vocab {args.vocab.name} "
        + (
            f"--no-sample --full-syllables {args.full_syllables}"
            if args.no_sample
            else f"--sample-chars {args.sample_chars}"
        )
        + f"` on {cpu_model()}, {os.cpu_count()} CPU cores, Python "
        f"{platform.python_version()}, botok {measured['botok']}.",
        "",
        "**The machine was shared** (load average in the tables; 2 cores): wall times are "
        "pessimistic and noisy. CPU seconds (of the segmenting processes) measure the work "
        "itself and are what the extrapolation uses.",
        "",
        *(_per_source(report, rows) if rows else _from_run(measured, args.full_syllables)),
        "## The measured run (news + literature, the experiments' corpus)",
        "",
        f"`tibnlp corpus prepare ... --set corpus.words=true` ({measured['num_proc']} "
        f"processes): {measured['syllables']:,} syllables, {measured['characters']:,} "
        f"characters, {measured['words']:,} words in {measured['shards']} shards; "
        f"**{measured['wall_seconds'] / 60:.1f} min wall**, {measured['cpu_seconds'] / 60:.1f} "
        f"CPU-minutes in the segmenting processes "
        f"({measured['syllables'] / measured['cpu_seconds']:,.0f} syllables per CPU-second, "
        f"{measured['syllables'] / measured['wall_seconds']:,.0f} syllables/s wall on the "
        "shared machine).",
        "",
        f"## Masks (first {args.mask_docs} training documents, seq_len {args.seq_len}, "
        "50 batches of 32, mask_prob 0.15)",
        "",
        f"{masks['examples']:,} examples, {masks['pieces']:,} pieces, "
        f"{masks['pieces'] / masks['syllables']:.3f} pieces per syllable, "
        f"{masks['pieces'] / masks['words']:.3f} pieces per word, "
        f"{masks['syllables'] / masks['words']:.3f} syllables per word.",
        "",
        "| masking | pieces masked / real pieces | words touched | words cut (partly masked) |",
        "|---|---:|---:|---:|",
    ]
    for name in ("span", "whole_word"):
        m = masks[name]
        lines.append(
            f"| {name} | {m['rate']:.4f} | {m['words_touched']:,} | {m['words_cut']:,} "
            f"({m['words_cut'] / max(m['words_touched'], 1):.1%}) |"
        )
    lines.append("")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.output, "\n".join(lines))
    print(f"wrote {args.output}")


def _from_run(measured: dict, syllables: int) -> list[str]:
    """The full corpus's cost from the measured run's CPU rate (no per-source sample)."""
    rate = measured["syllables"] / measured["cpu_seconds"]
    wall_rate = measured["syllables"] / measured["wall_seconds"]
    cpu = syllables / rate
    return [
        "## Full corpus (extrapolated from the measured run below)",
        "",
        f"{syllables:,} syllables at {rate:,.0f} syllables per CPU-second: **{cpu / 60:.0f} "
        f"CPU-minutes**; {cpu / 120:.0f} min wall on 2 dedicated cores (shards are independent), "
        f"{cpu / 60 / 16:.1f} min on 16; {syllables / wall_rate / 60:.0f} min at the wall rate "
        "the shared machine gave the measured run. News and literature only: other sources "
        "(classical, canonical text) were not sampled (`--no-sample`) and may segment at "
        "another rate.",
        "",
    ]


def _per_source(report: dict, rows: list[dict]) -> list[str]:
    by_source = report["by_source"]
    lines = [
        "## Segmentation cost per source (a sample of each, one process)",
        "",
        "| source | sample chars | sample syllables | CPU s | wall s | load | syllables/CPU-s "
        "| chars/CPU-s | words/syllable | full-corpus syllables | extrapolated CPU min |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    total_cpu = total_syl = 0.0
    for r in rows:
        rate = r["syllables"] / r["cpu"]
        syl = by_source[r["source"]]["syllables"]
        total_cpu += syl / rate
        total_syl += syl
        lines.append(
            f"| {r['source']} | {r['characters']:,} | {r['syllables']:,} | {r['cpu']:.1f} | "
            f"{r['wall']:.1f} | {r['load']:.1f} | {rate:,.0f} | {r['characters'] / r['cpu']:,.0f} "
            f"| {r['words'] / r['syllables']:.2f} | {syl:,} | {syl / rate / 60:.1f} |"
        )
    lines += [
        "",
        f"Full corpus ({report['total']['syllables']:,} syllables, "
        f"{report['total']['characters']:,} characters): **{total_cpu / 60:.0f} CPU-minutes** "
        f"extrapolated ({total_syl / total_cpu:,.0f} syllables per CPU-second overall); "
        f"{total_cpu / 120:.0f} min wall on 2 dedicated cores (shards are independent), "
        f"{total_cpu / 60 / 16:.0f} min on 16.",
        "",
    ]
    return lines


if __name__ == "__main__":
    run_script(main)
