"""Dataset manifests: what the toolkit knows about each dataset and corpus, never the data.

Manifests are the YAML files in the repository's `corpora/` folder, installed with the package
as `tibnlp.manifests`. Each names its folder in the data directory, its files with sha256,
license and citation, and for labelled sets the splits and fields.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
import zlib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml

from tibnlp.config.core import from_dict
from tibnlp.data.datadir import data_dir
from tibnlp.errors import DataError

if TYPE_CHECKING:  # importlib.resources.abc is new in Python 3.11
    from importlib.resources.abc import Traversable

# Sets that are not redistributed (a user downloads them, so `files` lists no checksums): the
# archive the loader cuts into splits when none of the split files is there, as (pattern in the
# dataset's folder, the file inside it that is read).
ARCHIVES: dict[str, tuple[str, str]] = {"tncc_document": ("*.zip", "document-tibetan.txt")}


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
        return read_label_file(self.require(self.labels_file), "restore the file: ")

    def require(self, relative: str) -> Path:
        """A file of this dataset, or an error saying what is wrong and what to do: download
        the set (its folder is absent), or restore the file (the folder is there without it:
        `tibnlp data link` leaves an existing folder alone, so linking again would not)."""
        path = self.path / relative
        if path.is_file():
            return path
        if path.is_symlink() and not path.exists():
            what = f"is a broken link to {os.readlink(path)}"
        elif path.exists():
            what = "is not a file"
        else:
            what = "is missing"
        if self.path.is_dir():
            hint = (
                f"restore {relative} in {self.path} (`tibnlp data list` names every missing "
                f"or changed file), or remove {self.path} and link a complete copy: "
                "`tibnlp data link SOURCE_DIR`"
            )
            if self.download:
                hint = f"{hint}; {self.download}"
        else:
            hint = self.download or (
                f"put the '{self.name}' files in {self.path} (data directory: {data_dir()}; "
                "set $TIBNLP_DATA or run `tibnlp data link SOURCE_DIR`)"
            )
        raise DataError(f"dataset '{self.name}': {path} {what}", hint)

    def archives(self) -> list[Path]:
        """The archives in this set's folder that its loader may cut into splits (`ARCHIVES`;
        none for a set that is not downloaded by the user)."""
        if self.name not in ARCHIVES or not self.path.is_dir():
            return []
        return sorted(p for p in self.path.glob(ARCHIVES[self.name][0]) if p.is_file())

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
            if not self.files:  # a set the user downloads: its split files or its archive
                return self._downloaded_status(verify) if self.splits else "present"
            absent = [f for f in self.files if not (path / f).is_file()]
            if len(absent) == len(self.files):  # a wrong folder linked or copied here
                return f"holds none of its {len(self.files)} files (e.g. {next(iter(self.files))})"
            if absent:
                named = [f if not (path / f).exists() else f"{f} (not a file)" for f in absent]
                return f"partial: missing {listed(named)}"
            if verify:
                changed = [
                    rel for rel, digest in self.files.items() if sha256_file(path / rel) != digest
                ]
                if changed:
                    return f"checksum mismatch: {listed(changed)}"
        except OSError as exc:  # no permission on the folder or a file, an I/O error
            return f"unreadable: {exc.filename or path} ({exc.strerror or exc})"
        return "present"

    def _downloaded_status(self, verify: bool) -> str:
        """`status` of a set without checksums: what its loader would read (the split files,
        else the one archive) or why it would refuse (some split files only, several
        archives, none of either), in the loader's terms (`tibnlp.data.tncc_document`)."""
        rels = list(self.splits.values())
        absent = [rel for rel in rels if not (self.path / rel).is_file()]
        if not absent:
            return f"present: {listed(rels)} (no checksums: a set you download)"
        if len(absent) < len(rels):
            named = [r if not (self.path / r).exists() else f"{r} (not a file)" for r in absent]
            return f"partial: missing {listed(named)}"
        archives = self.archives()
        if len(archives) > 1:
            return f"ambiguous: {len(archives)} archives ({listed([a.name for a in archives])})"
        if not archives:
            pattern = ARCHIVES[self.name][0] if self.name in ARCHIVES else ""
            return f"holds none of its files ({listed(rels)}{' or ' + pattern if pattern else ''})"
        if verify:
            try:
                archive_member(self, archives[0], check_crc=True)
            except DataError as exc:
                return f"damaged: {exc.message}"
        return f"present: {archives[0].name} (cut 8:1:1 at load; no checksums: a set you download)"


def read_label_file(path: Path, advice: str = "") -> list[str]:
    """Class names in label-id order from a labels file: a JSON list, or {"labels": [...]}.
    `advice` leads the hint of a file of another shape."""
    data = read_json(path)
    if isinstance(data, dict) and "labels" in data:
        data = data["labels"]
    if not isinstance(data, list) or not all(isinstance(x, str) for x in data):
        raise DataError(
            f"{path}: expected a list of label names (or {{'labels': [...]}})",
            f"{advice}the class names as strings, in label-id order",
        )
    return check_label_list(data, path)


def status_ok(status: str) -> bool:
    """Whether a `Manifest.status` says the set is usable as it is."""
    return status == "present" or status.startswith("present:")


def archive_member(manifest: Manifest, path: Path, check_crc: bool = False) -> str:
    """The name of the file inside `path` (a zip in the folder of `manifest`) that its loader
    reads (`ARCHIVES`), or an error naming the zip: not a zip, no such file, several.
    Entries under `__MACOSX/` (a Mac's resource forks, "._NAME") are not candidates.
    `check_crc`: also read every entry and check its CRC (a truncated download)."""
    wanted = ARCHIVES[manifest.name][1]
    hint = f"download the archive again; {manifest.download}"
    try:
        with zipfile.ZipFile(path) as zf:
            names = [
                n for n in zf.namelist() if Path(n).name == wanted and not n.startswith("__MACOSX/")
            ]
            bad = zf.testzip() if check_crc and names else None
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError) as exc:  # zlib: a damaged member
        raise DataError(f"{path}: not a readable zip ({exc})", hint) from exc
    if bad is not None:
        raise DataError(f"{path}: {bad} is damaged (CRC mismatch)", hint)
    if not names:
        raise DataError(f"{path}: holds no {wanted}", hint)
    if len(names) > 1:
        raise DataError(
            f"{path}: holds {len(names)} files named {wanted} ({', '.join(names)})",
            "keep the archive of the release alone in the folder",
        )
    return names[0]


def listed(names: list[str], most: int = 4) -> str:
    """The first `most` of `names`, comma-separated, and how many more there are."""
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


def manifest_folder() -> Traversable:
    """Where the manifests are read from: the source checkout's `corpora/` if there is one,
    else the installed copy (`tibnlp.manifests`)."""
    checkout = Path(__file__).resolve().parents[2] / "corpora"
    return checkout if checkout.is_dir() else resources.files("tibnlp.manifests")


def _manifest_files() -> list[tuple[str, str]]:
    folder = manifest_folder()
    return sorted(
        (e.name, e.read_text(encoding="utf-8"))
        for e in folder.iterdir()
        if e.name.endswith(".yaml")
    )


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
        known = f"known{' ' + kind if kind else ''} datasets: {', '.join(sorted(candidates))}"
        if "/" in name or Path(name).suffix in (".jsonl", ".json", ".txt", ".tsv", ".csv"):
            raise DataError(
                f"unknown dataset '{name}': a dataset is named by its manifest, not by a file",
                f"{known}. A labelled set of your own is a folder holding train.jsonl, "
                "validation.jsonl and test.jsonl: `tibnlp finetune classify --dataset "
                "./FOLDER` (README: your own labelled data)",
            )
        raise DataError(f"unknown dataset '{name}'", known)
    return candidates[name]


def read_json(path: Path) -> Any:
    """A JSON file (a byte-order mark, as Windows editors write, is dropped), with an error
    naming the file and line where it is not valid JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8-sig"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        where = f"{path}:{exc.lineno}" if isinstance(exc, json.JSONDecodeError) else str(path)
        raise DataError(f"{where}: not valid JSON ({exc})", "fix or restore the file") from exc
