"""`tibnlp corpus prepare`: raw text files -> a prepared corpus directory.

Output layout (a contract: vocabulary and pretraining read it through `load_prepared`):

    OUT/dataset/           datasets.DatasetDict (save_to_disk), splits `train` and `heldout`,
                           one row per document: doc_id int64 (position of the document in the
                           inputs, in reading order), source string (input file name, with
                           its folders where two inputs share a name: `source_names`),
                           sentences list[string] (normalised, in document order)
    OUT/report.json        figures (documents, sentences, syllables, characters) per split,
                           total and per source; dropped_lines (empty, too_little_tibetan,
                           too_few_syllables, and with on_error=skip invalid_utf8,
                           invalid_json, missing_field), dropped_sentences (duplicate),
                           dropped_documents (no_kept_lines, all_duplicates); inputs with
                           name, source, size, sha256, lines, documents
    OUT/corpus.yaml        the CorpusConfig used (less `OUTPUT_NEUTRAL` settings: num_proc)
                           and the inputs (source, sha256)
    OUT/tibnlp-corpus.json {"kind": "prepared_corpus", "version": 1}
    OUT/.prepare-run.json  how and from where it was made: num_proc, seconds (per step), the
                           inputs' absolute paths
    OUT/words/             with `corpus.words`: the botok words of every sentence, for
                           whole-word masking (`tibnlp.text.corpus_words`, added after the
                           corpus is published, so an interrupted segmentation resumes)

All but the hidden run files (this one, and words/'s) are the same bytes for the same input
files and settings (`_write_records`; words/: and the same pack content and botok version),
so the caches keyed on a prepared corpus find it again.

Steps: read the inputs into a raw Arrow file (documents = blank-line separated blocks, or JSONL
records); a map over `num_proc` processes (`process_map`) normalises, filters and splits each
document (documents are shuffled first so the process shards get similar amounts of text);
then, in document order, exact sentence dedup across the whole corpus and the held-out split
by document (`dedup_split`).

Nothing half-written: the corpus is built in a hidden temporary directory beside OUT and renamed
into place only on success. An existing OUT is refused unless `force=True`, and even then only a
previous prepared corpus (or an empty directory) is replaced, never an unrelated folder.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

import datasets
import yaml
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from tibnlp.config.core import to_dict
from tibnlp.config.identity import OUTPUT_NEUTRAL
from tibnlp.config.text import CorpusConfig
from tibnlp.errors import DataError
from tibnlp.fsutil import staged_dir
from tibnlp.text.dedup_split import ArrowWriterCtx, dedup_and_split
from tibnlp.text.filtering import process_documents
from tibnlp.text.input_files import expand_inputs, source_names
from tibnlp.text.prepared import MARKER, MARKER_CONTENT, load_prepared
from tibnlp.text.process_map import map_batches
from tibnlp.text.readers import InputInfo, no_tibetan_hint, read_documents

__all__ = ["MARKER", "MARKER_CONTENT", "load_prepared", "prepare_corpus"]
RUN_FILE = ".prepare-run.json"  # how and from where this corpus was made (`_write_records`)
_RAW_FEATURES = datasets.Features(
    {
        "doc_id": datasets.Value("int64"),
        "source": datasets.Value("string"),
        "line": datasets.Value("int64"),
        "lines": datasets.Sequence(datasets.Value("string")),
    }
)


def _check_output(output: Path, force: bool, words: bool = False) -> None:
    if not output.exists() and not output.is_symlink():
        return
    replaceable = output.is_dir() and ((output / MARKER).is_file() or not any(output.iterdir()))
    if not force and words and (output / MARKER).is_file() and not _has_words(output):
        # a run with corpus.words stopped while segmenting: the corpus is published, its
        # words are not; --force would prepare it again and drop the finished word shards
        raise DataError(
            f"output {output} already exists: a prepared corpus without its botok words "
            "(a run with corpus.words stopped while segmenting?)",
            f"finish the words, resuming from the shards done: tibnlp corpus words {output}; "
            "or pass --force to prepare the corpus again from the start",
        )
    if not force:
        raise DataError(
            f"output {output} already exists",
            "pass --force to replace a previous prepared corpus, or choose another --output",
        )
    if not replaceable:
        raise DataError(
            f"output {output} exists and is not a prepared corpus; refusing to replace it",
            "choose another --output (only a previous prepared corpus is replaced by --force)",
        )


def _has_words(corpus: Path) -> bool:
    from tibnlp.text.corpus_words import META_FILE, WORDS_DIR

    return (corpus / WORDS_DIR / META_FILE).is_file()


def _progress(enabled: bool) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),  # a log, not the command's output: stdout stays clean
        disable=not enabled,
    )


def _read_inputs(
    files: list[Path], raw_path: Path, cfg: CorpusConfig, progress: bool
) -> list[InputInfo]:
    """Stream every input into one raw Arrow file of documents (one row per document)."""
    infos = []
    doc_id = 0
    with (
        ArrowWriterCtx(raw_path, _RAW_FEATURES) as writer,
        _progress(progress) as bar,
    ):
        task = bar.add_task("reading", total=sum(f.stat().st_size for f in files))
        for i, (path, source) in enumerate(zip(files, source_names(files), strict=True), 1):
            bar.update(task, description=f"reading {i}/{len(files)} {path.name}")
            info = InputInfo(path=str(path.resolve()), size=path.stat().st_size, source=source)
            docs = read_documents(
                path, info, cfg.field, cfg.on_error, lambda n: bar.advance(task, n)
            )
            for doc in docs:
                writer.write(
                    {"doc_id": doc_id, "source": doc.source, "line": doc.line, "lines": doc.lines}
                )
                doc_id += 1
            if not info.has_tibetan and cfg.on_error == "fail":
                raise DataError(
                    f"{path}: no Tibetan text in {info.lines} line(s)", no_tibetan_hint(info)
                )
            infos.append(info)
    return infos


def prepare_corpus(
    inputs: list[Path],
    output: Path,
    cfg: CorpusConfig,
    progress: bool = True,
    force: bool = False,
) -> dict[str, Any]:
    """Prepare `inputs` into `output` (layout in the module docstring); returns the report."""
    started = time.perf_counter()
    output = Path(output)
    files = expand_inputs([Path(p) for p in inputs])
    _check_output(output, force, cfg.words)
    if cfg.words:  # fail before hours of work, not after: botok and its pack must be here
        from tibnlp.text.words import botok_version, require_pack

        botok_version()
        require_pack()
    num_proc = cfg.num_proc or os.cpu_count() or 1
    was_enabled = datasets.is_progress_bar_enabled()
    if not progress:
        datasets.disable_progress_bars()
    try:
        with staged_dir(output, replace=True) as tmp:
            work = tmp / "work"
            work.mkdir()
            timings = {"setup": time.perf_counter() - started}
            infos = _read_inputs(files, work / "raw.arrow", cfg, progress)
            _check_documents(infos)
            timings["read"] = time.perf_counter() - started - sum(timings.values())
            processed = _process(work, cfg, num_proc, progress)
            timings["process"] = time.perf_counter() - started - sum(timings.values())
            report = dedup_and_split(processed, tmp, cfg, infos)
            timings["dedup_split_write"] = time.perf_counter() - started - sum(timings.values())
            shutil.rmtree(work)
            run = {
                "num_proc": num_proc,
                "seconds": round(time.perf_counter() - started, 2),
                "seconds_by_step": {k: round(v, 2) for k, v in timings.items()},
            }
            _write_records(tmp, report, cfg, infos, run)
            (tmp / MARKER).write_text(json.dumps(MARKER_CONTENT) + "\n", encoding="utf-8")
            _check_output(output, force)  # again at publish time: OUT may have appeared since
    finally:
        if was_enabled and not progress:
            datasets.enable_progress_bars()
    if cfg.words:
        from tibnlp.text.corpus_words import segment_corpus, stderr_progress

        segment_corpus(output, num_proc, progress=stderr_progress if progress else None)
    return {**report, **run}


def _write_records(
    tmp: Path,
    report: dict[str, Any],
    cfg: CorpusConfig,
    infos: list[InputInfo],
    run: dict[str, Any],
) -> None:
    """report.json and corpus.yaml say what the corpus is, and nothing of how or where it was
    made: they are hashed into the caches built on it (with the splits' fingerprints,
    `content_fingerprint`), which the same inputs and settings must find again, whatever
    the process count, the time taken or the folder the inputs were read from. That goes
    into RUN_FILE (hidden: hashes of a folder, `path_hash`, pass over it). Plain writes:
    the whole directory is staged, so no file needs its own rename."""
    (tmp / "report.json").write_text(
        json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    settings = {k: v for k, v in to_dict(cfg).items() if f"corpus.{k}" not in OUTPUT_NEUTRAL}
    inputs = [{"source": i.source, "sha256": i.sha256} for i in infos]
    (tmp / "corpus.yaml").write_text(
        yaml.safe_dump({"corpus": settings, "inputs": inputs}, sort_keys=False, allow_unicode=True),
        encoding="utf-8",
    )
    record = {**run, "inputs": [i.path for i in infos]}
    (tmp / RUN_FILE).write_text(
        json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )


def _check_documents(infos: list[InputInfo]) -> None:
    """Refuse inputs that gave no document, saying why: lines skipped by `--on-error skip`
    (a whole file of them is a format mistake, not "empty files") or empty files."""
    if any(i.documents for i in infos):
        return
    skipped: Counter[str] = Counter()
    for info in infos:
        skipped.update(info.skipped)
    if skipped:
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(skipped.items()))
        raise DataError(
            f"the inputs hold no documents: every line was skipped ({reasons})",
            "run again without --on-error skip to see the first bad line and why",
        )
    raise DataError("the inputs hold no documents (all files empty?)", "check the --input files")


STEP = "normalise, filter, split"


def _process(
    work: Path, cfg: CorpusConfig, num_proc: int, progress: bool = True
) -> datasets.Dataset:
    raw = datasets.Dataset.from_file(str(work / "raw.arrow"))
    # Shuffled so that each process gets a similar share of text (documents are very unequal
    # and sorted by source); the order is restored (by doc_id) before dedup.
    shuffled = raw.shuffle(seed=cfg.seed, keep_in_memory=True)
    kwargs = {
        "join_spaced_syllables": cfg.join_spaced_syllables,
        "min_tibetan_ratio": cfg.min_tibetan_ratio,
        "min_syllables": cfg.min_syllables,
        "ga_boundary": cfg.split_on_ga_space,
    }
    # (not datasets' num_proc: its pool hung when stopped, `process_map`)
    return map_batches(
        shuffled,
        process_documents,
        kwargs,
        num_proc,
        work,
        STEP,
        progress,
        batch_size=8,
        writer_batch_size=64,
        remove_columns=["lines", "line"],
    )
