"""Dataset manifests: what the toolkit knows about each dataset and corpus, never the data.

Manifests are the YAML files in the repository's `corpora/` folder, installed with the package
as `tibnlp.manifests`. Each names its folder in the data directory, its files with sha256,
license and citation, and for labelled sets the splits and fields.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml

from tibnlp.config.core import from_dict
from tibnlp.data.datadir import data_dir
from tibnlp.errors import DataError


@dataclass
class Manifest:
    name: str
    kind: Literal["classification", "adversarial", "corpus", "resource"]  # resource: a tool's data
    description: str
    root: str  # folder inside the data directory
    license: str
    citation: str
    files: dict[str, str] = field(default_factory=dict)  # relative path -> sha256
    splits: dict[str, str] = field(default_factory=dict)
    targets: dict[str, str] = field(default_factory=dict)  # adversarial: dataset -> file
    labels_file: str = ""
    text_field: str = "text"
    label_field: str = "label"
    text_form: Literal["spaced_syllables", "tsheg", "word_segmented"] = "tsheg"
    max_len: int = 0
    download: str = ""  # what to get and where to put it, for sets not redistributed

    @property
    def path(self) -> Path:
        return data_dir() / self.root

    def labels(self) -> list[str]:
        """Class names in label-id order, from `labels_file`."""
        path = self.require(self.labels_file)
        data = read_json(path)
        if isinstance(data, dict) and "labels" in data:
            data = data["labels"]
        if not isinstance(data, list) or not all(isinstance(x, str) for x in data):
            raise DataError(f"{path}: expected a list of label names (or {{'labels': [...]}})")
        return check_label_list(data, path)

    def require(self, relative: str) -> Path:
        """A file of this dataset, or an error saying what to download and where."""
        path = self.path / relative
        if not path.exists():
            hint = self.download or (
                f"put the '{self.name}' files in {self.path} (data directory: {data_dir()}; "
                "set $TIBNLP_DATA or run `tibnlp data link SOURCE_DIR`)"
            )
            raise DataError(f"dataset '{self.name}': {path} is missing", hint)
        return path

    def status(self, verify: bool = True) -> str:
        """'present', 'missing' (nothing at its folder), or what is wrong with what is there
        ("broken link to X", "not a folder", "holds none of its N files", "partial: missing
        A, B", "checksum mismatch: A, B", "unreadable: PATH (why)"). `verify`: also hash
        every file; else only check that each is there."""
        path = self.path
        try:
            if path.is_symlink() and not path.exists():  # its copy moved: not just absent
                return f"broken link to {os.readlink(path)}"
            if not path.exists():
                return "missing"
            if not path.is_dir():
                return "not a folder"
            if not self.files:
                return "present"
            absent = [f for f in self.files if not (path / f).is_file()]
            if len(absent) == len(self.files):  # a wrong folder linked or copied here
                return f"holds none of its {len(self.files)} files (e.g. {next(iter(self.files))})"
            if absent:
                named = [f if not (path / f).exists() else f"{f} (not a file)" for f in absent]
                return f"partial: missing {_listed(named)}"
            if verify:
                changed = [
                    rel for rel, digest in self.files.items() if sha256_file(path / rel) != digest
                ]
                if changed:
                    return f"checksum mismatch: {_listed(changed)}"
        except OSError as exc:  # no permission on the folder or a file, an I/O error
            return f"unreadable: {exc.filename or path} ({exc.strerror or exc})"
        return "present"


def _listed(names: list[str], most: int = 4) -> str:
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def check_label_list(labels: list[str], path: Path) -> list[str]:
    """`labels`, refused when empty or when a name repeats: a record's label maps to the
    name's last position, so a repeated name trains a class no record has and reports it."""
    if not labels:
        raise DataError(f"{path}: the label list is empty", "list the class names in id order")
    seen: set[str] = set()
    for i, name in enumerate(labels):
        if name in seen:
            raise DataError(
                f"{path}: label '{name}' is listed twice (again at position {i})",
                "each class once, in label-id order; fix or restore the file",
            )
        seen.add(name)
    return labels


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def _manifest_files() -> list[tuple[str, str]]:
    """From the source checkout's `corpora/` if there is one, else the installed copy."""
    checkout = Path(__file__).resolve().parents[2] / "corpora"
    if checkout.is_dir():
        entries = [(p.name, p.read_text(encoding="utf-8")) for p in checkout.glob("*.yaml")]
    else:
        folder = resources.files("tibnlp.manifests")
        entries = [
            (e.name, e.read_text(encoding="utf-8"))
            for e in folder.iterdir()
            if e.name.endswith(".yaml")
        ]
    return sorted(entries)


def all_manifests() -> dict[str, Manifest]:
    out = {}
    for filename, text in _manifest_files():
        try:
            out_manifest = from_dict(Manifest, yaml.safe_load(text))
        except Exception as exc:  # a broken manifest is a packaging bug; name the file
            raise DataError(f"manifest corpora/{filename} is invalid: {exc}") from exc
        out[out_manifest.name] = out_manifest
    return out


def get_manifest(name: str, kind: str | None = None) -> Manifest:
    manifests = all_manifests()
    candidates = {n: m for n, m in manifests.items() if kind is None or m.kind == kind}
    if name not in candidates:
        raise DataError(
            f"unknown dataset '{name}'",
            f"known{' ' + kind if kind else ''} datasets: {', '.join(sorted(candidates))}",
        )
    return candidates[name]


def read_json(path: Path) -> Any:
    """A JSON file, with an error naming the file and line where it is not valid JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        where = f"{path}:{exc.lineno}" if isinstance(exc, json.JSONDecodeError) else str(path)
        raise DataError(f"{where}: not valid JSON ({exc})", "fix or restore the file") from exc
