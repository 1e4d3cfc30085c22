"""What a record's label is: a JSON value read as a class name (`class_name`), the same way for
a set's files and for `tibnlp predict`'s input (a class written two ways is one class
everywhere), and a file's `label` <-> `label_id` pairs checked to be one mapping (`LabelIds`).
Kept apart from the set reader (`tibnlp.data.labelled`), which needs only these answers.
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path
from typing import Any

from tibnlp.errors import DataError


def record_label(record: dict[str, Any], label_field: str, path: Path, lineno: int) -> str:
    """A record's class name (`class_name`), or an error naming the file, line and field."""
    try:
        return class_name(record[label_field])
    except BadLabel as exc:
        raise DataError(f"{path}:{lineno}: the '{label_field}' field {exc}", exc.hint) from exc


class BadLabel(ValueError):
    """A value that is no class name: what it is, and what to do."""

    def __init__(self, said: str, hint: str) -> None:
        super().__init__(said)
        self.hint = hint


def class_name(value: object) -> str:
    """A label value as a class name, NFC (as texts are: a Tibetan name typed in another
    normalisation is the same class): a JSON string, or a whole number or true/false written
    as JSON (1 and 1.0 are class "1", as "1" is). A null, a list, a blank name or one with
    spaces at its ends is refused (`BadLabel`): str() of it made a class of its own ("None",
    "['A']", "Positive " beside "Positive") that trained silently."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return str(int(value))
    if not isinstance(value, str):
        raise BadLabel(
            f"is {_json_kind(value)}, not a class name",
            "give each record one class name as a JSON string (or a whole number); a record "
            "without a label trains nothing and cannot be scored: label it or remove it",
        )
    if not value.strip():
        raise BadLabel("is blank", "give the record its class name, or remove the record")
    if value != value.strip():
        raise BadLabel(
            f"{value!r} has spaces at its ends",
            f"remove them: {value!r} and {value.strip()!r} would be two classes",
        )
    return nfc_name(value)


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"the number {value} (not a whole number)"
    return f"a JSON {'object' if isinstance(value, dict) else 'list'} ({json.dumps(value)[:40]})"


def nfc_name(name: str) -> str:
    """A class name as labels are compared: NFC, the form `class_name` gives."""
    return unicodedata.normalize("NFC", name)


class LabelIds:
    """A file's `label` <-> `label_id` pairs must be one mapping: the loader reads the label,
    so a record edited on one field only would train silently on the other reading. Any
    consistent numbering passes (another order than the labels file, 1-based ids); records
    without a `label_id`, and sets labelled by id, are not checked."""

    def __init__(self, label_field: str) -> None:
        self.on = label_field != "label_id"
        self.id_of: dict[str, tuple[Any, int]] = {}  # label -> (label_id, line)
        self.label_of: dict[str, tuple[str, int]] = {}  # label_id as JSON -> (label, line)

    def check(self, record: dict[str, Any], label: str, where: Path, lineno: int) -> None:
        if not self.on or "label_id" not in record:
            return
        given = record["label_id"]
        key = json.dumps(given)
        first_id, id_line = self.id_of.setdefault(label, (given, lineno))
        first_label, label_line = self.label_of.setdefault(key, (label, lineno))
        if json.dumps(first_id) != key:
            said = f"label '{label}' has label_id {key}, and {first_id!r} on line {id_line}"
        elif first_label != label:
            said = (
                f"label_id {key} is label '{label}' here and '{first_label}' on line {label_line}"
            )
        else:
            return
        raise DataError(
            f"{where}:{lineno}: {said}",
            "a record was edited on one field only; the loader reads the label: fix the "
            "record's label or label_id (classes merged or renamed on purpose: drop the "
            "label_id field, which nothing else reads)",
        )
