"""The last step of `tibnlp corpus prepare`: the processed documents put back in reading
order (the step before ran over shuffled shards), their sentences deduplicated exactly across
the whole corpus (`corpus.dedup`: first occurrences kept), the documents split into `train`
and `heldout` by document, both written as the corpus's dataset, and the report's figures
counted on the way (layout: `tibnlp.text.prepare`). `ArrowWriterCtx` also stages the raw
documents that `prepare` reads in.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import datasets
import numpy as np

from tibnlp.config.text import CorpusConfig
from tibnlp.errors import DataError
from tibnlp.text.filtering import LINE_REASONS, choose_heldout, dedup_mask
from tibnlp.text.prepared import SPLITS, content_fingerprint, save_splits
from tibnlp.text.readers import InputInfo

FEATURES = datasets.Features(
    {
        "doc_id": datasets.Value("int64"),
        "source": datasets.Value("string"),
        "sentences": datasets.Sequence(datasets.Value("string")),
    }
)


@contextmanager
def _quiet() -> Iterator[None]:
    """No `datasets` progress bars for steps that take no time worth showing."""
    enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if enabled:
            datasets.enable_progress_bars()


class ArrowWriterCtx:
    """`datasets` ArrowWriter as a context manager that always closes its file."""

    def __init__(self, path: Path, features: datasets.Features) -> None:
        from datasets.arrow_writer import ArrowWriter

        self.writer = ArrowWriter(features=features, path=str(path), writer_batch_size=256)

    def __enter__(self) -> Any:
        return self.writer

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.writer.finalize()
        self.writer.close()


def _figures() -> dict[str, int]:
    return {"documents": 0, "sentences": 0, "syllables": 0, "characters": 0}


def dedup_and_split(
    processed: datasets.Dataset, tmp: Path, cfg: CorpusConfig, infos: list[InputInfo]
) -> dict[str, Any]:
    """Dedup sentences in document order, split by document, write the DatasetDict."""
    order = np.argsort(np.asarray(processed["doc_id"]), kind="stable")
    ordered = processed.select(order, keep_in_memory=True)
    dropped_lines: Counter[str] = Counter()
    for info in infos:
        dropped_lines.update(info.skipped)
    for reason in LINE_REASONS:
        dropped_lines[reason] += sum(processed[f"dropped_{reason}"])
    nonempty = {
        int(d): s
        for d, s, sents in zip(
            processed["doc_id"], processed["source"], processed["syllables"], strict=True
        )
        if sents
    }
    heldout = choose_heldout(nonempty, cfg.heldout_fraction, cfg.seed)
    figures = {split: _figures() for split in SPLITS}
    per_source: dict[str, dict[str, int]] = {}
    seen: set[int] = set()
    duplicates = 0
    no_kept_lines = len(processed) - len(nonempty)
    all_duplicates = 0
    writers = {s: ArrowWriterCtx(tmp / "work" / f"{s}.arrow", FEATURES) for s in SPLITS}
    with writers["train"] as train_w, writers["heldout"] as heldout_w:
        for row in ordered.select_columns(["doc_id", "source", "sentences", "syllables", "keys"]):
            if cfg.dedup:
                keep = dedup_mask(row["keys"], seen, cfg.dedup_min_syllables, row["syllables"])
            else:
                keep = [True] * len(row["keys"])
            sentences = [s for s, k in zip(row["sentences"], keep, strict=True) if k]
            duplicates += len(keep) - len(sentences)
            if not sentences:
                all_duplicates += bool(row["sentences"])
                continue
            split = "heldout" if row["doc_id"] in heldout else "train"
            (heldout_w if split == "heldout" else train_w).write(
                {"doc_id": row["doc_id"], "source": row["source"], "sentences": sentences}
            )
            syl = sum(n for n, k in zip(row["syllables"], keep, strict=True) if k)
            for fig in (figures[split], per_source.setdefault(row["source"], _figures())):
                fig["documents"] += 1
                fig["sentences"] += len(sentences)
                fig["syllables"] += syl
                fig["characters"] += sum(len(s) for s in sentences)
    total = {k: figures["train"][k] + figures["heldout"][k] for k in figures["train"]}
    if total["sentences"] == 0:
        raise DataError(
            "the prepared corpus would be empty: every line was dropped "
            f"({', '.join(f'{k}: {v}' for k, v in sorted(dropped_lines.items()) if v)})",
            "check the inputs, or lower corpus.min_tibetan_ratio / corpus.min_syllables",
        )
    _check_splits(figures, cfg.heldout_fraction, infos)
    dataset = datasets.DatasetDict(
        {
            s: datasets.Dataset.from_file(str(tmp / "work" / f"{s}.arrow"))
            if figures[s]["documents"]
            else datasets.Dataset.from_dict({k: [] for k in FEATURES}, features=FEATURES)
            for s in SPLITS
        }
    )
    for split, data in dataset.items():  # the content's, not the staging folder's
        data._fingerprint = content_fingerprint(tmp / "work" / f"{split}.arrow", split)
    with _quiet():
        save_splits(dataset, tmp / "dataset")
    return {
        "kind": "prepared_corpus",
        "version": 1,
        "splits": figures,
        "total": total,
        "by_source": dict(sorted(per_source.items())),
        "dropped_lines": {k: v for k, v in sorted(dropped_lines.items())},
        "dropped_sentences": {"duplicate": duplicates},
        "dropped_documents": {"no_kept_lines": no_kept_lines, "all_duplicates": all_duplicates},
        "inputs": [i.as_dict() for i in infos],
        "text_bytes": sum(i.text_bytes for i in infos),
    }


def _check_splits(
    figures: dict[str, dict[str, int]], fraction: float, infos: list[InputInfo]
) -> None:
    """Refuse a corpus with nothing to train on; warn of one with no held-out document
    although one was asked for (a small corpus, or a .txt without blank lines): it trains,
    but the vocabulary report and pretraining have no held-out scores."""
    train, heldout = figures["train"]["documents"], figures["heldout"]["documents"]
    names = [i.source for i in infos]
    inputs = ", ".join(names) if len(names) <= 3 else f"{len(names)} inputs"
    if not train:
        raise DataError(
            f"{inputs}: all {heldout} document(s) went to the held-out split "
            f"(corpus.heldout_fraction={fraction}), none is left to train on",
            "lower corpus.heldout_fraction, or add documents (a .txt document ends at a "
            "blank line, a JSONL record is one document)",
        )
    if fraction > 0 and not heldout:
        print(
            f"warning: {inputs}: no document for the held-out split: the input has {train} "
            "document(s) (a .txt document ends at a blank line, a JSONL record is one); "
            "there will be no held-out scores. Add blank lines between documents for them, "
            "or set corpus.heldout_fraction=0 to say none are wanted",
            file=sys.stderr,
            flush=True,
        )
