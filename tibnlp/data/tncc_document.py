"""TNCC's document task: its split JSONL files when a user made them, else the FudanNLP
release zip cut in order 8:1:1, said on stderr. Apart from the title task and the other sets
because it alone is downloaded by the user, carries no checksums, and may come as an archive.
"""

from __future__ import annotations

import sys
import zipfile
import zlib
from pathlib import Path

from tibnlp.data.labelled import (
    Example,
    LabelledSet,
    check_ids_across_splits,
    model_text,
    read_splits,
    warn_classes_not_in_train,
    warn_left_out,
)
from tibnlp.data.manifests import Manifest, archive_member, get_manifest
from tibnlp.errors import DataError
from tibnlp.fsutil import text_lines

MIN_ZIP_DOCUMENTS = 8  # the fewest the 8:1:1 cut (`_split_in_order`) leaves no split empty


def load_tncc_document() -> LabelledSet:
    """Its split JSONL files, all three, else the one FudanNLP zip cut in order 8:1:1 (said on
    stderr, naming the zip), else an error saying what is there and what to add."""
    manifest = get_manifest("tncc_document")
    labels = _document_labels(manifest)
    files, archive = _document_source(manifest)
    source: dict[str, Path] | Path
    if archive is None:
        source = files
        splits = read_splits(files, labels, manifest.text_field, manifest.label_field)
        check_ids_across_splits(manifest.name, files, splits)
    else:
        member = archive_member(manifest, archive)
        source = Path(f"{archive}!{member}")
        documents = _read_fudan_zip(archive, member, labels)
        splits = _split_in_order(documents)
        empty = [s for s, part in splits.items() if not part]
        if empty:  # 5 to 7 documents leave validation empty (8:1:1 rounded), not test alone
            raise DataError(
                f"{source}: {len(documents)} document(s), too few to cut into "
                f"train/validation/test 8:1:1 ({' and '.join(empty)} would be empty; it takes "
                f"at least {MIN_ZIP_DOCUMENTS})",
                "download the FudanNLP zip again",
            )
        sizes = "/".join(str(len(splits[s])) for s in ("train", "validation", "test"))
        print(
            f"dataset '{manifest.name}': reading {archive} ({member}), cut in order 8:1:1 into "
            f"train/validation/test {sizes} (no {', '.join(manifest.splits.values())} in "
            f"{manifest.path})",
            file=sys.stderr,
            flush=True,
        )
    warn_classes_not_in_train(manifest.name, source, splits, labels)
    return LabelledSet(
        name="tncc-document",
        labels=labels,
        splits=splits,
        source_form=manifest.text_form,
        max_len=manifest.max_len,
        manifest=manifest.name,
        text_field=manifest.text_field,
        label_field=manifest.label_field,
    )


def _document_labels(manifest: Manifest) -> list[str]:
    """Its own labels file if there is one, else the title task's: the same 12 classes in the
    same order."""
    if (manifest.path / manifest.labels_file).exists():
        return manifest.labels()
    try:
        return get_manifest("tncc").labels()
    except DataError as exc:
        raise DataError(
            f"the TNCC document task reads the title task's labels: {exc.message}",
            f"{exc.hint}; or put {manifest.labels_file} (the class names in label-id order) "
            f"in {manifest.path}",
        ) from exc


def _document_source(manifest: Manifest) -> tuple[dict[str, Path], Path | None]:
    """What the document task reads: (its split files, None) when all of them are there, or
    ({}, the zip) when none is and one zip is. Some split files only is refused rather than
    read from the zip: the files were meant to be the split, and the zip's cut differs."""
    folder = manifest.path
    rels = manifest.splits
    present = {s: folder / rel for s, rel in rels.items() if (folder / rel).is_file()}
    if len(present) == len(rels):
        return present, None
    archives = manifest.archives()
    if present:
        missing = [rel for s, rel in rels.items() if s not in present]
        also = (
            f", or remove {', '.join(rels[s] for s in present)} to read {archives[0].name} cut "
            "in order 8:1:1 instead"
            if len(archives) == 1
            else ""
        )
        raise DataError(
            f"dataset '{manifest.name}': {folder} holds "
            f"{', '.join(rels[s] for s in present)} but not {', '.join(missing)}",
            f"add {', '.join(missing)} (JSONL with '{manifest.text_field}' and "
            f"'{manifest.label_field}' fields){also}",
        )
    if len(archives) > 1:
        raise DataError(
            f"dataset '{manifest.name}': {folder} holds {len(archives)} zips "
            f"({', '.join(a.name for a in archives)}); which one to read is unclear",
            "keep the FudanNLP release zip alone in the folder",
        )
    if not archives:
        raise DataError(
            f"the TNCC document task is not in the data directory ({folder} has neither "
            f"{', '.join(rels.values())} nor the FudanNLP zip)",
            manifest.download + _text_splits_hint(folder),
        )
    return {}, archives[0]


def _text_splits_hint(folder: Path) -> str:
    """A pointer for a copy of the metaphors split (train.txt ...: 'Label<TAB>text' lines),
    which the loader does not read as it is."""
    found = sorted(p.name for p in folder.glob("*.txt")) if folder.is_dir() else []
    if not found:
        return ""
    return (
        f" ({folder} holds {', '.join(found)}: 'Label<TAB>text' files are read only inside the "
        'FudanNLP zip; write each split as JSONL, one {"text": ..., "label": ...} per line)'
    )


def _read_fudan_zip(path: Path, member: str, labels: list[str]) -> list[Example]:
    """The documents of `member` in the zip; as in `read_jsonl`, a byte-order mark is dropped,
    bad UTF-8 names its line, and a document with no text is left out with a warning (the zip
    is cut into splits after reading, so it cannot be refused in evaluation splits only)."""
    index = {name: i for i, name in enumerate(labels)}
    where = f"{path}!{member}"
    try:
        with zipfile.ZipFile(path) as zf:
            raw = zf.read(member)
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError) as exc:  # a damaged download
        raise DataError(
            f"{where}: cannot be read ({exc})", "download the FudanNLP zip again"
        ) from exc
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        bad = len(text_lines(raw[: exc.start].decode("utf-8-sig") + "x"))
        raise DataError(
            f"{where}:{bad}: invalid UTF-8 ({exc.reason})", "download the FudanNLP zip again"
        ) from exc
    out, blank = [], []
    for lineno, line in enumerate(text_lines(text), 1):
        if not line.strip():
            continue
        label, sep, body = line.partition("\t")
        if not sep or label not in index:
            found = f"label '{label}'" if sep else "no tab"
            raise DataError(
                f"{where}:{lineno}: expected 'Label<TAB>text' with a known label ({found})",
                f"known labels: {', '.join(labels)}",
            )
        doc = model_text(body)
        if not doc.strip():
            blank.append(lineno)
            continue
        out.append(
            Example(f"tncc-document-{lineno - 1:05d}", doc, index[label], f"{where}:{lineno}")
        )
    warn_left_out(where, "document(s) with no text left out", blank)
    if not out:
        raise DataError(f"{where}: holds no documents", "download the FudanNLP zip again")
    return out


def _split_in_order(examples: list[Example]) -> dict[str, list[Example]]:
    """The title split's convention: the (already shuffled) file cut in order, 8:1:1."""
    n = len(examples)
    a, b = round(n * 0.8), round(n * 0.9)
    return {"train": examples[:a], "validation": examples[a:b], "test": examples[b:]}
