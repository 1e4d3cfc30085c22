"""Reading a prepared corpus directory (`tibnlp corpus prepare` output): its marker and its
`train`/`heldout` datasets. Apart from `prepare` so that what builds on a prepared corpus
(word segmentation, pretraining data) needs nothing of how it is made.

`save_splits` and `load_saved` are the one way every saved dataset here (the corpus, its
botok words, the tokenised pretraining data) goes to disk and back: an empty split reloads,
and a damaged folder is a DataError, not a `datasets` traceback."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import datasets

from tibnlp.errors import DataError

MARKER = "tibnlp-corpus.json"
MARKER_CONTENT = {"kind": "prepared_corpus", "version": 1}
SPLITS = ("train", "heldout")


def load_prepared(path: Path) -> datasets.DatasetDict:
    """The `train`/`heldout` DatasetDict of a prepared corpus directory."""
    path = Path(path)
    marker = path / MARKER
    if not path.exists():
        raise DataError(
            f"corpus {path} does not exist",
            "run `tibnlp corpus prepare --input FILE... --output DIR` and pass DIR",
        )
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


def save_splits(data: datasets.Dataset | datasets.DatasetDict, folder: Path) -> None:
    """`save_to_disk`, with an empty split saved as one empty shard: saved as none (a corpus
    prepared with heldout_fraction 0), `load_from_disk` fails on it."""
    shards: Any
    if isinstance(data, datasets.DatasetDict):
        shards = {s: None if len(d) else 1 for s, d in data.items()}
    else:
        shards = None if len(data) else 1
    data.save_to_disk(str(folder), num_shards=shards)


def content_fingerprint(arrow_file: Path, split: str) -> str:
    """A split's `datasets` fingerprint, from the bytes of the Arrow file it is saved from.
    `Dataset.from_file` makes one of the file's path (in a randomly named staging folder) and
    modification time, and state.json keeps it: two identical preparations differed, and the
    caches keyed on it (pretraining data, corpus words) were built again for nothing."""
    digest = hashlib.sha256(f"tibnlp-prepared-corpus\0{split}\0".encode())
    with open(arrow_file, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()[:16]  # (the length of `datasets`' own fingerprints)


def load_saved(folder: Path, what: str, hint: str) -> Any:
    """`load_from_disk`; files deleted or cut short since (FileNotFoundError, ArrowInvalid,
    ...) are a DataError naming `what` and the folder, with `hint`."""
    try:
        return datasets.load_from_disk(str(folder))
    except (OSError, ValueError, IndexError, KeyError) as exc:
        raise DataError(f"{what} {folder} cannot be read ({exc})", hint) from exc


def _load_splits(path: Path) -> datasets.DatasetDict:
    """The saved DatasetDict, with both splits: a damaged one says to prepare it again."""
    try:
        dataset = load_saved(path / "dataset", "dataset", "")
    except DataError as exc:
        raise _incomplete(path, exc.message) from exc
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
