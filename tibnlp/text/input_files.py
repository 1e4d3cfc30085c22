"""Which files a corpus is read from: the `--input` paths expanded, named and checked.

A folder is read with its subfolders (hidden ones and tibnlp's own outputs passed over); a
file given twice, or one compressed or archived in a way that is not read (zstd, lz4, zip, 7z,
rar, tar), is refused by name before any reading starts. Each input gets a `source` name that
tells it apart from the others. Reading the files is `readers`'s job.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from tibnlp.errors import DataError
from tibnlp.fsutil import walk_files

TEXT_SUFFIXES = (".txt", ".text", ".jsonl", ".json")
# Each opener takes an open binary file object and returns a binary stream of the content.
COMPRESSED: dict[str, Callable[[Any], IO[bytes]]] = {
    ".xz": lzma.open,
    ".gz": gzip.open,  # type: ignore[dict-item]
    ".bz2": bz2.open,
}
# Compressions and archives that are not read: named, rather than read as bytes (and refused
# as "NUL bytes, UTF-16?") or, in a folder, left out without a word.
_UNSUPPORTED = {
    ".zst": "zstd-compressed",
    ".zstd": "zstd-compressed",
    ".lz4": "lz4-compressed",
    ".zip": "a zip archive",
    ".7z": "a 7z archive",
    ".rar": "a rar archive",
}
_TIBNLP_MARKER = re.compile(r"tibnlp-[a-z]+\.json")


def expand_inputs(paths: list[Path]) -> list[Path]:
    """Files to read: each path itself, or the text files (sorted) of a directory and of its
    subfolders (`corpus/2019/*.txt`: read too, not silently left out). Hidden files and
    folders, and folders that tibnlp made (a prepared corpus or vocabulary, whose report.json
    is no JSONL input), are passed over."""
    if not paths:
        raise DataError("no input given", "pass one or more --input PATH")
    files: list[Path] = []
    for path in paths:
        path = Path(path)
        if path.is_dir():
            found = _folder_files(path)
            if not found:
                raise DataError(
                    f"input directory {path} holds no .txt/.jsonl files (plain or .xz/.gz/.bz2)",
                    "give the files themselves or a folder that holds them",
                )
            files += found
        elif path.is_file():
            refuse_unsupported(path, _unsupported_suffix(path))
            files.append(path)
        elif path.exists():  # a device, socket or pipe: "does not exist" would send the user astray
            raise DataError(
                f"input {path} is not a regular file", "give a text or JSONL file, or a folder"
            )
        elif path.is_symlink():
            raise DataError(f"input {path} is a broken link", "check where it points")
        else:
            raise DataError(f"input {path} does not exist", "check the --input path")
    _refuse_repeats(files)
    return files


def _refuse_repeats(files: list[Path]) -> None:
    """One file read twice (`--input corpora corpora/news.txt`) puts each of its documents in
    the corpus twice, and the held-out draw can send one copy to each side: held-out text the
    model trained on, unless deduplication happens to drop the copy."""
    first: dict[Path, Path] = {}
    for file in files:
        real = file.resolve()
        if real not in first:
            first[real] = file
        else:
            seen = first[real]
            raise DataError(
                f"input file {seen} is given twice: as {seen} and as {file} (a folder that "
                "holds it, a link to it, or the same path again)",
                "give each file once: a file read twice would put the same documents on both "
                "sides of the held-out split",
            )


def _folder_files(folder: Path) -> list[Path]:
    """The input files under `folder`, at any depth, sorted by their path."""

    def unreadable(top: Path, exc: OSError) -> None:  # no permission to list it: no traceback
        raise DataError(
            f"cannot read input directory {top}: {exc.strerror or exc}",
            "check its permissions, or give the files themselves",
        ) from exc

    def ours(top: Path, entries: list[Path]) -> bool:  # a corpus prepared into the folder
        return any(_TIBNLP_MARKER.fullmatch(p.name) for p in entries)

    found: list[Path] = []
    for entry in walk_files(folder, ours, unreadable):
        if base_suffix(entry) in TEXT_SUFFIXES:
            found.append(entry)
        elif (bad := _unsupported_suffix(entry)) in _UNSUPPORTED and (
            Path(entry.stem).suffix.lower() in TEXT_SUFFIXES
        ):  # `a.txt.zst`: text, named rather than left out
            refuse_unsupported(entry, bad)
    return sorted(found)


def _unsupported_suffix(path: Path) -> str:
    """The compression or archive suffix of a file that cannot be read as text ("" if none):
    `a.txt.zst`, `a.jsonl.zip`, `texts.tar.gz`."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in _UNSUPPORTED:
        return suffixes[-1]
    if ".tar" in suffixes[-2:] or (suffixes and suffixes[-1] in (".tgz", ".tbz2", ".txz")):
        return ".tar"
    return ""


def refuse_unsupported(path: Path, suffix: str) -> None:
    if not suffix:
        return
    what = _UNSUPPORTED.get(suffix, "a tar archive")
    if suffix == ".tar":
        hint = f"unpack it (tar -xf {path}) and give the folder"
    else:
        hint = "decompress it, or recompress it with xz, gzip or bzip2 (.xz/.gz/.bz2 are read)"
    raise DataError(f"input {path} is {what}, which cannot be read", hint)


def source_names(files: list[Path]) -> list[str]:
    """The `source` of each input: its file name, or, where different files share that name
    (`tibettimes/news.txt`, `nanhai/news.txt`), as many trailing folders as tell them apart,
    so per-source figures and the held-out split, stratified by source, never pool two
    inputs. The same file given twice (refused by `expand_inputs`) is one source."""
    shown: dict[Path, Path] = {}  # resolved file -> the first path given for it
    resolved = [Path(file).resolve() for file in files]
    for real, file in zip(resolved, files, strict=True):
        shown.setdefault(real, Path(file).absolute())
    # Files whose last k parts differ from every other's are named by them; only those that
    # still collide take one folder more (names equal on k parts are equal on fewer), so a
    # folder of many files costs one pass per level, not a comparison of every pair.
    names: dict[Path, str] = {}
    pending, k = dict(shown), 1
    while pending:
        tails = {real: Path(*path.parts[-k:]).as_posix() for real, path in pending.items()}
        counts = Counter(tails.values())
        for real, tail in tails.items():
            if counts[tail] == 1:
                names[real] = tail
                del pending[real]
        k += 1
    return [names[real] for real in resolved]


def base_suffix(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in COMPRESSED:
        suffixes = suffixes[:-1]
    return suffixes[-1] if suffixes else ".txt"
