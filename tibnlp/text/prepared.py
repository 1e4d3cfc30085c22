"""Reading a prepared corpus directory (`tibnlp corpus prepare` output): its marker and its
`train`/`heldout` datasets. Apart from `prepare` so that what builds on a prepared corpus
(word segmentation, pretraining data) needs nothing of how it is made."""

from __future__ import annotations

import json
from pathlib import Path

import datasets

from tibnlp.errors import DataError

MARKER = "tibnlp-corpus.json"
MARKER_CONTENT = {"kind": "prepared_corpus", "version": 1}
SPLITS = ("train", "heldout")


def load_prepared(path: Path) -> datasets.DatasetDict:
    """The `train`/`heldout` DatasetDict of a prepared corpus directory."""
    path = Path(path)
    marker = path / MARKER
    if not marker.is_file():
        raise DataError(
            f"{path} is not a prepared corpus (no {MARKER} in it)",
            "run `tibnlp corpus prepare --input FILE... --output DIR` and pass DIR",
        )
    try:
        meta = json.loads(marker.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{marker}: not valid JSON ({exc})", "run tibnlp corpus prepare") from exc
    if meta.get("kind") != "prepared_corpus" or meta.get("version") != 1:
        raise DataError(
            f"{marker}: unsupported prepared corpus {meta!r} (expected {MARKER_CONTENT})",
            "re-run tibnlp corpus prepare with this version of tibnlp",
        )
    return _load_splits(path)


def _load_splits(path: Path) -> datasets.DatasetDict:
    """The saved DatasetDict; a damaged one (files deleted or cut short) is a DataError, so
    the user learns to prepare the corpus again rather than reading a `datasets` traceback."""
    try:
        dataset = datasets.load_from_disk(str(path / "dataset"))
    except (OSError, ValueError, IndexError, KeyError) as exc:  # FileNotFoundError, ArrowInvalid
        raise _incomplete(path, f"{path / 'dataset'} cannot be read: {exc}") from exc
    missing = [s for s in SPLITS if not isinstance(dataset, dict) or s not in dataset]
    if missing:
        raise _incomplete(path, f"no {' or '.join(missing)} split in {path / 'dataset'}")
    assert isinstance(dataset, datasets.DatasetDict)
    return dataset


def _incomplete(path: Path, detail: str) -> DataError:
    return DataError(
        f"prepared corpus {path} is incomplete ({detail})",
        f"prepare it again: tibnlp corpus prepare --input FILE... --output {path} --force",
    )
