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
    dataset = datasets.load_from_disk(str(path / "dataset"))
    assert isinstance(dataset, datasets.DatasetDict)
    return dataset
