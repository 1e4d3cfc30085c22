"""Labelled sets of one's own: a folder given for `finetune.dataset` instead of a manifest name,
so a researcher fine-tunes on their data without adding a manifest to the installed package.

The folder holds `train.jsonl`, `validation.jsonl` and `test.jsonl`: one JSON object per line
with `text` and `label` (the class name; `id` optional), read with the checks of the shipped
sets (`tibnlp.data.labelled.read_checked_splits`). Optional: `labels.json` (the class names in
label-id order, as in a shipped set; without it, the sorted distinct training labels) and
`dataset.yaml` (the manifest keys a set may change: `FolderSetConfig`). The set is named by its
folder, and the hash of the files read there extends the seeds' data hash: a changed file trains
again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from tibnlp.config.core import check, from_dict
from tibnlp.config.yaml_loader import read_yaml
from tibnlp.data.class_names import BadLabel, class_name
from tibnlp.data.labelled import (
    LabelledSet,
    joins_spaced_syllables,
    read_checked_splits,
    record_labels,
)
from tibnlp.data.manifests import all_manifests, check_label_list, sha256_file
from tibnlp.errors import ConfigError, DataError, TibnlpError

SPLITS = ("train", "validation", "test")
LABELS_FILE = "labels.json"
SETTINGS_FILE = "dataset.yaml"
SETTINGS_KEYS = (
    "dataset.yaml may set text_field, label_field, text_form (tsheg or word_segmented), "
    "max_len and splits (train, validation, test: file names)"
)
ABSENT = "absent"  # an optional file's digest when it is not there: adding it is a change
LAYOUT = (
    "train.jsonl, validation.jsonl and test.jsonl, one JSON object per line with 'text' and "
    "'label' (the class name)"
)


@dataclass
class FolderSplits:
    """The split files, relative to the folder."""

    train: str = "train.jsonl"
    validation: str = "validation.jsonl"
    test: str = "test.jsonl"

    def validate(self, prefix: str) -> None:
        names = [getattr(self, split) for split in SPLITS]
        for split, rel in zip(SPLITS, names, strict=True):
            inside = (
                bool(rel.strip()) and not Path(rel).is_absolute() and ".." not in Path(rel).parts
            )
            check(inside, f"{prefix}.{split}", "must name a file inside the dataset folder")
        # as paths: "./test.jsonl" and "test.jsonl" are one file, read as two splits
        distinct = len({Path(rel) for rel in names}) == len(names)
        check(distinct, prefix, f"each split needs a file of its own (given: {', '.join(names)})")


@dataclass
class FolderSetConfig:
    """`dataset.yaml`: the manifest keys (`tibnlp.data.manifests.Manifest`) a folder set may
    set; any other key is refused, naming it."""

    text_field: str = "text"
    label_field: str = "label"
    # tsheg: syllables separated by spaces or tshegs (TNCC's form); word_segmented: words
    # separated by spaces, tshegs kept (the spaces are removed, `model_text`)
    text_form: Literal["tsheg", "word_segmented"] = "tsheg"
    max_len: int = 0  # tokens incl. [CLS]/[SEP] when finetune.max_len is 0; 0: 128
    splits: FolderSplits = field(default_factory=FolderSplits)

    def validate(self, prefix: str) -> None:
        for key in ("text_field", "label_field"):
            check(bool(getattr(self, key).strip()), key, "must name a field of the records")
        check(self.max_len == 0 or self.max_len >= 3, "max_len", "must be 0 (default) or >= 3")


def is_folder_dataset(value: str) -> bool:
    """The rule of `finetune.dataset`: a value with a path separator is a folder set; a
    shipped set's name is that set (a folder of that name is `./NAME`); any other value is
    a folder set when such a folder exists, else an unknown name."""
    if not value.strip():
        return False
    if _has_separator(value):
        return True
    return value not in shipped_names() and Path(value).expanduser().is_dir()


def shipped_names() -> set[str]:
    """The classification sets the manifests name (TNCC's document task among them)."""
    return {n for n, m in all_manifests().items() if m.kind == "classification"}


def _has_separator(value: str) -> bool:
    return any(s in value for s in ("/", os.sep, os.altsep or os.sep))


def dataset_folder(value: str) -> Path:
    """The folder `value` names, or an error saying what is there instead."""
    path = Path(value).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise DataError(
            f"dataset folder {path} is a file, not a folder",
            f"give the folder that holds {LAYOUT}",
        )
    raise DataError(
        f"dataset folder {path.absolute()} does not exist",
        f"check the path (a relative one counts from the current directory, {Path.cwd()}); "
        "a shipped set is named without a '/': " + ", ".join(sorted(shipped_names())),
    )


def read_settings(folder: Path) -> FolderSetConfig:
    """The folder's `dataset.yaml`, checked like a config file; defaults without one."""
    path = folder / SETTINGS_FILE
    if not path.exists():
        return FolderSetConfig()
    try:
        data = read_yaml(path)  # names the file (and line) of a file that is not a mapping
    except TibnlpError as exc:  # (which says nothing of what the file may hold)
        raise type(exc)(
            exc.message, exc.hint or f"{SETTINGS_KEYS}, as a YAML mapping, e.g. 'max_len: 64'"
        ) from exc
    try:
        return from_dict(FolderSetConfig, data)
    except ConfigError as exc:
        raise ConfigError(
            f"{path}: {exc.message}", f"{SETTINGS_KEYS}; fix or remove the key"
        ) from exc


def load_folder_set(value: str) -> LabelledSet:
    """The set in folder `value` (`is_folder_dataset`), read and checked as a shipped set is."""
    folder = dataset_folder(value)
    name = folder.resolve().name
    settings = read_settings(folder)
    files = _split_files(name, folder, settings)
    labels, said = _labels(name, folder, files, settings)
    join = joins_spaced_syllables(settings.text_form)
    fields = (settings.text_field, settings.label_field)
    splits = read_checked_splits(
        name, files, labels, *fields, join, fields_from=str(folder / SETTINGS_FILE)
    )
    notes = {"dataset_folder": str(folder.resolve())}
    if said:
        notes["labels"] = said
    return LabelledSet(
        name=name,
        labels=labels,
        splits=splits,
        source_form=settings.text_form,
        max_len=settings.max_len,
        folder=str(folder.resolve()),
        files_sha256=files_sha256(folder_files(folder, settings)),
        notes=notes,
        text_field=settings.text_field,
        label_field=settings.label_field,
    )


def folder_files(folder: Path, settings: FolderSetConfig | None = None) -> dict[str, str]:
    """Every file a folder set is read from (its splits, labels.json, dataset.yaml), as
    `NAME/FILE` -> sha256, or `ABSENT` for one that is not there. Without `settings`, the
    folder's dataset.yaml as far as it reads (a broken one: the default split names, and its
    own hash, so a cached result made before it broke is not reused)."""
    if settings is None:
        try:
            settings = read_settings(folder)
        except TibnlpError:
            settings = FolderSetConfig()
    name = folder.resolve().name
    rels = [getattr(settings.splits, s) for s in SPLITS] + [LABELS_FILE, SETTINGS_FILE]
    return {
        f"{name}/{Path(rel).as_posix()}": (
            sha256_file(folder / rel) if (folder / rel).is_file() else ABSENT
        )
        for rel in rels
    }


def files_sha256(files: dict[str, str]) -> str:
    """One hash of `folder_files` (the same as `tibnlp.tracking.config_hash` of it, which a
    pipeline stage tags as its data hash)."""
    text = json.dumps(files, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _split_files(name: str, folder: Path, settings: FolderSetConfig) -> dict[str, Path]:
    """The three split files, or one error naming every one that is missing."""
    files = {split: folder / getattr(settings.splits, split) for split in SPLITS}
    missing = [
        getattr(settings.splits, split) + (" (a folder)" if path.is_dir() else "")
        for split, path in files.items()
        if not path.is_file()
    ]
    if missing:
        hint = (
            f"a folder set holds {LAYOUT}; other file names are set under splits: in "
            f"{folder / SETTINGS_FILE}"
        )
        raise DataError(f"dataset '{name}': {folder} lacks {', '.join(missing)}", hint)
    return files


def _labels(
    name: str, folder: Path, files: dict[str, Path], settings: FolderSetConfig
) -> tuple[list[str], str]:
    """The label list, and what the run's notes say of it ("" when labels.json gives it)."""
    path = folder / LABELS_FILE
    if path.exists():
        return read_label_list(path), ""
    fields = (settings.text_field, settings.label_field, str(folder / SETTINGS_FILE))
    labels = sorted_labels({label for _, label in record_labels(files["train"], *fields)})
    if not labels:
        raise DataError(
            f"{files['train']}: holds no records (it is empty or blank)",
            "fill it: one JSON object per line with the text and its label",
        )
    known = set(labels)
    for split in ("validation", "test"):
        for lineno, label in record_labels(files[split], *fields):
            if label not in known:
                raise DataError(
                    f"{files[split]}:{lineno}: label '{label}' is in no training record",
                    f"without {LABELS_FILE} the classes are the training labels "
                    f"({', '.join(labels)}): fix the label, add training records of it, or "
                    f"list every class in {path} (in label-id order)",
                )
    order = "sorted as numbers" if _numeric(labels) else "sorted"
    said = (
        f"no {LABELS_FILE}: the classes are the {len(labels)} distinct training labels, "
        f"{order}, label ids 0..{len(labels) - 1}: {', '.join(labels)}"
    )
    print(f"note: dataset '{name}': {said}", file=sys.stderr, flush=True)
    return labels, said


def sorted_labels(labels: set[str]) -> list[str]:
    """The label order without labels.json: by value where every label is a whole number
    (2 before 10, as a user numbering classes means), else by name."""
    if _numeric(labels):
        return sorted(labels, key=lambda label: (int(label), label))
    return sorted(labels)


def _numeric(labels: Iterable[str]) -> bool:
    """Every label an integer literal `int` reads (was: any number of leading dashes, so
    "--1" counted and `int` then crashed the sort)."""
    return all(re.fullmatch(r"-?[0-9]+", label) for label in labels)


def read_label_list(path: Path) -> list[str]:
    """Class names in label-id order from a labels file, as a shipped set's
    (`Manifest.labels`): a list, or {"labels": [...]}. Read as the records are: a byte-order
    mark (Windows editors write one) is dropped, and a name is what `class_name` makes of
    it (NFC; a whole number is its digits, as a record's numeric label)."""
    example = '["negative", "positive"]'
    if not path.is_file():
        raise DataError(
            f"{path} is not a file",
            f"give the class names as a JSON list, e.g. {example}, or remove it",
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as exc:
        raise DataError(
            f"{path}:{exc.lineno}: not valid JSON ({exc.msg}, column {exc.colno})",
            f"the class names in label-id order as a JSON list, e.g. {example}",
        ) from exc
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not valid UTF-8 ({exc.reason})", "save it as UTF-8") from exc
    if isinstance(data, dict) and "labels" in data:
        data = data["labels"]
    if not isinstance(data, list):
        raise DataError(
            f"{path}: expected a list of label names (or {{'labels': [...]}}), found "
            f"{type(data).__name__}",
            f"the class names in label-id order, e.g. {example}",
        )
    names = []
    for label_id, value in enumerate(data):
        try:
            names.append(class_name(value))
        except BadLabel as exc:
            raise DataError(
                f"{path}: label id {label_id} {exc}",
                exc.hint
                if isinstance(value, str)
                else f"each class name once, as a JSON string, in label-id order, e.g. {example}",
            ) from exc
    return check_label_list(names, path)
