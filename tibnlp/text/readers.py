"""Input formats for corpus preparation: plain, .xz/.gz/.bz2 text and JSONL, as documents.

Plain text: documents are separated by blank lines (the `corpora/` convention), one paragraph
or sentence per line; a line ends at LF, CRLF or a lone CR. JSONL: one record is one document;
its text field (`--field`) may hold several lines. Compression is recognised by suffix or by
magic bytes; zstd, lz4, zip, 7z, rar and tar are named and refused, never read as text.
Which files are read (folders, repeats, source names) is `input_files`'s job.

Errors name the file and, where it applies, the line: a missing path, a corrupt or truncated
compressed stream (always fatal), invalid UTF-8, bad JSON or a missing field (fatal, or counted
and skipped with `on_error="skip"`).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import lzma
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal

from tibnlp.errors import DataError
from tibnlp.text.input_files import COMPRESSED, base_suffix, refuse_unsupported
from tibnlp.text.syllables import has_tibetan_letter

_MAGIC = {b"\xfd7zXZ\x00": ".xz", b"\x1f\x8b": ".gz", b"BZh": ".bz2"}
_UNSUPPORTED_MAGIC = {
    b"\x28\xb5\x2f\xfd": ".zst",
    b"\x04\x22\x4d\x18": ".lz4",
    b"PK\x03\x04": ".zip",
    b"7z\xbc\xaf\x27\x1c": ".7z",
    b"Rar!": ".rar",
}
# a progress update at least every this many bytes of text, however long the lines
_ADVANCE_BYTES = 1 << 20
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")  # UTF-32's little-endian mark starts like one
_CORRUPT = (lzma.LZMAError, gzip.BadGzipFile, zlib.error, EOFError, OSError)


@dataclass
class Document:
    """Raw lines of one document, with where it starts (1-based line number)."""

    source: str
    line: int
    lines: list[str]


@dataclass
class InputInfo:
    """What was read from one input file (goes into the report)."""

    path: str
    size: int
    source: str = ""  # the documents' `source` (see `source_names`)
    sha256: str = ""
    format: str = "text"
    compression: str = ""
    lines: int = 0
    documents: int = 0
    text_bytes: int = 0
    has_tibetan: bool = False
    first_text: str = ""  # the first non-blank text read, cut (for a "no Tibetan" message)
    skipped: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, object]:
        """For report.json: the file by name and content, not by where it was (`path`: a
        corpus made from moved inputs is the same corpus)."""
        return {
            "name": Path(self.path).name,
            "source": self.source,
            "size": self.size,
            "sha256": self.sha256,
            "format": self.format,
            "compression": self.compression or None,
            "lines": self.lines,
            "documents": self.documents,
            "text_bytes": self.text_bytes,
            "has_tibetan": self.has_tibetan,
            "skipped_lines": dict(sorted(self.skipped.items())),
        }


def _compression(path: Path, raw: IO[bytes]) -> str:
    suffix = path.suffix.lower()
    if suffix in COMPRESSED:
        return suffix
    head = raw.read(6)
    raw.seek(0)
    other = next((kind for magic, kind in _UNSUPPORTED_MAGIC.items() if head.startswith(magic)), "")
    refuse_unsupported(path, other)
    return next((kind for magic, kind in _MAGIC.items() if head.startswith(magic)), "")


def read_documents(
    path: Path,
    info: InputInfo,
    field_name: str = "text",
    on_error: Literal["fail", "skip"] = "fail",
    advance: Callable[[int], None] | None = None,
) -> Iterator[Document]:
    """Documents of one file, streamed; fills `info` (counts, sha256) as it goes.

    The documents' `source` is `info.source` (`source_names` for several inputs), else the
    file name.

    `advance(n)` is called with the number of file bytes consumed since the last call (for a
    progress bar over the compressed sizes).
    """
    is_jsonl = base_suffix(path) in (".jsonl", ".json")
    info.format = "jsonl" if is_jsonl else "text"
    digest = hashlib.sha256()
    try:
        opened = path.open("rb")
    except OSError as exc:  # unreadable (permissions), or gone since it was listed
        raise DataError(
            f"cannot read input {path}: {exc.strerror or exc}", "check the file's permissions"
        ) from exc
    with opened as raw:
        info.compression = _compression(path, raw)
        stream = COMPRESSED[info.compression](raw) if info.compression else raw
        lines = _decoded_lines(path, stream, raw, info, on_error, advance)
        info.source = info.source or path.name
        yield from (_jsonl_docs if is_jsonl else _text_docs)(
            path, lines, info, field_name, on_error
        )
    with path.open("rb") as raw:  # hashed separately: the stream above may stop early on error
        for chunk in iter(lambda: raw.read(1 << 20), b""):
            digest.update(chunk)
    info.sha256 = digest.hexdigest()


def _physical_lines(stream: IO[bytes]) -> Iterator[bytes]:
    """The stream's lines, ending at LF, CRLF or a lone CR (classic Mac files; a CR the
    stream's own line iteration would leave inside one line, so that a whole file read as
    one line lost its line and document breaks)."""
    for data in stream:
        body = data.rstrip(b"\r\n")
        # a 0x0D byte in UTF-16 text (NUL bytes) is half a character (the shad U+0F0D), no CR
        if b"\r" not in body or b"\x00" in body:
            yield data
            continue
        *parts, last = body.split(b"\r")
        yield from (part + b"\n" for part in parts)
        yield last + data[len(body) :]


def _decoded_lines(
    path: Path,
    stream: IO[bytes],
    raw: IO[bytes],
    info: InputInfo,
    on_error: str,
    advance: Callable[[int], None] | None,
) -> Iterator[tuple[int, str]]:
    """(line number, text) of every line that decodes as UTF-8."""
    position = 0
    lineno = 0
    unreported = 0  # text bytes read since the last progress update
    iterator = _physical_lines(stream)
    while True:
        try:
            data = next(iterator)
        except StopIteration:
            break
        except _CORRUPT as exc:
            where = f"{path} (after line {lineno})" if lineno else str(path)
            raise DataError(
                f"{where}: cannot decompress {info.compression or 'the'} stream ({exc})",
                "the file is corrupt or truncated; re-download or re-compress it",
            ) from exc
        lineno += 1
        info.text_bytes += len(data)
        unreported += len(data)
        # every 2048 lines, or every MiB of text: a file of a few long lines (a book per
        # JSONL record) would otherwise show no progress until its end
        if advance is not None and (lineno % 2048 == 0 or unreported >= _ADVANCE_BYTES):
            now = raw.tell()
            advance(now - position)
            position = now
            unreported = 0
        if lineno == 1 and data[:2] in _UTF16_BOMS:
            _refuse_not_utf8(path, lineno, data)
        if b"\x00" in data:  # valid UTF-8, but no text holds it
            if on_error == "skip":
                info.skipped["invalid_utf8"] += 1
                continue
            _refuse_not_utf8(path, lineno, data)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            if on_error == "skip":
                info.skipped["invalid_utf8"] += 1
                continue
            raise DataError(
                f"{path}:{lineno}: invalid UTF-8 (byte {exc.start} of the line: "
                f"{data[exc.start : exc.start + 4]!r})",
                "convert the file to UTF-8, or pass --on-error skip to drop such lines",
            ) from exc
        if lineno == 1:
            text = text.removeprefix("\ufeff")
        yield lineno, text.rstrip("\r\n")
    info.lines = lineno
    if advance is not None:
        advance(raw.tell() - position)


def _refuse_not_utf8(path: Path, lineno: int, data: bytes) -> None:
    """A byte order mark (fatal even with on_error=skip: every line would be garbage) or NUL
    bytes: UTF-16/32 text (Windows "Unicode") or a binary file, never UTF-8 text."""
    if lineno == 1 and data[:2] in _UTF16_BOMS:
        what = "the file is UTF-16 or UTF-32 (it starts with a byte order mark)"
    else:
        what = "NUL bytes (UTF-16 or UTF-32 text, or a binary file)"
    raise DataError(
        f"{path}:{lineno}: invalid UTF-8: {what}",
        f"convert it to UTF-8 (iconv -f UTF-16 -t UTF-8 {path} > {Path(path).stem}.utf8.txt), "
        "or leave the file out",
    )


def _note_tibetan(info: InputInfo, text: str) -> None:
    if not info.first_text and text.strip():
        info.first_text = text.strip()[:60]
    if not info.has_tibetan and has_tibetan_letter(text):
        info.has_tibetan = True


def no_tibetan_hint(info: InputInfo) -> str:
    """What a file without Tibetan letters holds, in words, and what to do about it."""
    if not info.first_text and not any(info.skipped.values()):
        return "the file is empty or blank: leave it out of --input (or pass --on-error skip)"
    if not info.first_text:
        return "no line or record of it was read: check the file (and --field for JSONL)"
    sample = info.first_text
    letters = [c for c in sample if not c.isspace()]
    latin = sum(c.isascii() and (c.isalpha() or c in "'+-.") for c in letters)
    said = f"its first text is {sample!r}"
    if letters and latin >= 0.8 * len(letters):
        return (
            f"{said}: Latin script, perhaps Wylie/EWTS transliteration; convert it to Tibetan "
            "Unicode first (e.g. with pyewts), or check --field for JSONL"
        )
    return f"{said}; check the file (and --field for JSONL), or pass --on-error skip"


def _text_docs(
    _path: Path,
    lines: Iterator[tuple[int, str]],
    info: InputInfo,
    _field: str,
    _on_error: str,
) -> Iterator[Document]:
    current: list[str] = []
    start = 0
    for lineno, text in lines:
        if text.strip():
            if not current:
                start = lineno
            current.append(text)
            _note_tibetan(info, text)
        elif current:
            info.documents += 1
            yield Document(info.source, start, current)
            current = []
    if current:
        info.documents += 1
        yield Document(info.source, start, current)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _jsonl_docs(
    path: Path,
    lines: Iterator[tuple[int, str]],
    info: InputInfo,
    field_name: str,
    on_error: str,
) -> Iterator[Document]:
    for lineno, text in lines:
        if not text.strip():
            continue
        problem, reason, value = "", "", None
        hint = "pass --field NAME for the text field, or --on-error skip to drop such records"
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            problem, reason = f"invalid JSON ({exc.msg})", "invalid_json"
        else:
            value = record.get(field_name) if isinstance(record, dict) else None
            if not isinstance(record, dict):
                kind = type(record).__name__.replace("list", "array").replace("dict", "object")
                problem, reason = f"a JSON {kind}, not a record (an object)", "missing_field"
            elif not isinstance(value, str):
                problem, reason = f"no string field {field_name!r}", "missing_field"
            elif not _encodable(value):  # a lone \ud83d escape (a broken emoji): no character
                problem = (
                    f"field {field_name!r} holds an unpaired surrogate escape, not a character"
                )
                reason = "invalid_utf8"
                hint = "repair the record (a cut emoji?), or --on-error skip to drop such records"
        if text.lstrip().startswith("[") and not isinstance(value, str):
            # a .json file holding one array (of records) is the usual mistake: say so, rather
            # than send the user after --field or a JSON syntax error on its first line
            hint = (
                "the file looks like one JSON array; JSON Lines has one object per line "
                "(convert it, e.g. jq -c '.[]' FILE.json > FILE.jsonl)"
            )
        if problem or not isinstance(value, str):
            if on_error == "skip":
                info.skipped[reason] += 1
                continue
            raise DataError(f"{path}:{lineno}: {problem}", hint)
        doc_lines = [s for s in value.splitlines() if s.strip()]
        if doc_lines:
            _note_tibetan(info, value)
            info.documents += 1
            yield Document(info.source, lineno, doc_lines)
