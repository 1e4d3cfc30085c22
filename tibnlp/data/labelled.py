"""Labelled records in the text form the model sees: the set, its examples, and how a split's
JSONL file is read and checked (`tibnlp.data.tasks` names the sets; `tibnlp.data.class_names`
says what a label value is).

Every set is read the same way: the per-split JSONL files named by its manifest in `corpora/`
(or a folder of one's own: `tibnlp.data.folder_set`), the label order from its `labels.json`
(a folder without one: its sorted training labels). Texts are normalised once, here (form
"tsheg": NFC, U+0F0C -> U+0F0B, syllables separated by spaces, the TNCC title form, joined
with tsheg, which is how the pretraining corpus and the vocabulary spell them; in a
word-segmented set, `text_form: word_segmented`, the spaces between words are removed
instead, see `model_text`). Fine-tuning encodes them in the classifier's input form
(`model_text`, by default also without closing shads/tshegs: TNCC titles never end with a
shad, texts typed by users do), and prediction uses the same function with the form recorded
in the classifier, so training and inference cannot drift apart.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tibnlp.data.class_names import LabelIds, nfc_name, record_label
from tibnlp.data.manifests import listed
from tibnlp.errors import DataError
from tibnlp.fsutil import text_lines
from tibnlp.text.normalize import normalize, remove_word_spaces, strip_closing_marks

# Input forms, recorded in reports and in every fine-tuned classifier directory: "tsheg":
# normalised, spaced syllables joined with tsheg (also the form texts are loaded in, and that of
# classifiers trained before closing marks were trimmed); "tsheg-trimmed": the same without
# closing shads/tshegs (config `finetune.text_form`, the default).
STORED_TEXT_FORM = "tsheg"
TEXT_FORMS = ("tsheg", "tsheg-trimmed")


def joins_spaced_syllables(source_form: str) -> bool:
    """Whether a stored form's spaces are syllable boundaries (`model_text` joins them with
    tsheg), not the word boundaries of a `word_segmented` set (which it removes)."""
    return source_form != "word_segmented"


@dataclass(frozen=True)
class Example:
    id: str
    text: str  # already in the model's input form
    label: int
    where: str = field(default="", compare=False)  # "FILE:LINE" it was read from ("": unknown)


@dataclass
class LabelledSet:
    name: str  # e.g. "tncc-title", "tusa"
    labels: list[str]
    splits: dict[str, list[Example]] = field(default_factory=dict)
    source_form: str = "tsheg"  # text form as stored in the data directory
    max_len: int = 0  # manifest default (tokens); 0: none given
    # the record fields the text and the label were read from (the manifest's, or a folder
    # set's dataset.yaml): a classifier records them, so `predict` reads the set's own files
    text_field: str = "text"
    label_field: str = "label"
    manifest: str = ""
    # a set of one's own (`tibnlp.data.folder_set`): the folder it was read from, and the hash
    # of the files read there, which the seeds' data hash extends ("" for a shipped set: its
    # seeds keep their hash); `notes`: what its loader decided, for the run's notes
    folder: str = ""
    files_sha256: str = ""
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def join_spaced_syllables(self) -> bool:
        """How `model_text` reads its spaces (False: they separate words)."""
        return joins_spaced_syllables(self.source_form)

    def texts(self, split: str) -> list[str]:
        return [e.text for e in self.splits[split]]

    def targets(self, split: str) -> list[int]:
        return [e.label for e in self.splits[split]]


def model_text(text: str, form: str = STORED_TEXT_FORM, join_spaced_syllables: bool = True) -> str:
    """The model's input form of any spelling of a text (training and `predict` both use it;
    `predict` passes the form the classifier was trained with).

    `join_spaced_syllables`: a space between two syllables is a syllable boundary, as in
    TNCC titles, and becomes a tsheg. False for word-segmented text (a classifier trained on
    a `word_segmented` set), whose spaces separate words that keep their tshegs: there a
    space between two letters splits a particle off its syllable ("དྲ་བ འི" for "དྲ་བའི"),
    so it is removed (`remove_word_spaces`); joining would make "བ་འི", two syllables.
    """
    if form not in TEXT_FORMS:
        raise DataError(
            f"unknown model input form {form!r}", f"known forms: {', '.join(TEXT_FORMS)}"
        )
    text = normalize(text, join_spaced_syllables=join_spaced_syllables)
    if not join_spaced_syllables:
        text = remove_word_spaces(text)
    return strip_closing_marks(text) if form == "tsheg-trimmed" else text


def read_jsonl(
    path: Path,
    labels: list[str],
    text_field: str,
    label_field: str,
    join_spaced_syllables: bool = True,
    skip_blank: bool = False,
    id_prefix: str = "",
    fields_from: str = "",
) -> list[Example]:
    """Records of one split, texts in `model_text`'s stored form; a bad line, an unknown
    label (`record_label`), a repeated id or a blank text names the file and line. A record
    without an id (or with a null one) is named `PREFIX:LINE` (`id_prefix`, default the
    file's name: "train.jsonl:3"; was "train-3", one of a user's own ids, and the clash was
    then called a duplicated record); `fields_from`: the file that names the fields, for the
    hint of a record without them (a folder set's dataset.yaml).

    A byte-order mark (Windows editors write one) is dropped, as `tibnlp predict` does. A
    blank text is refused in an evaluation split (its prediction would read no text); with
    `skip_blank` (training splits) it is left out with a warning instead: it teaches nothing
    but its label, and shajiu_news_culture's train split has one upstream (SOURCE.md)."""
    index = {nfc_name(name): i for i, name in enumerate(labels)}
    out = []
    ids: dict[str, int] = {}  # id -> line
    named: set[int] = set()  # the lines of records without an id, named after their line
    skipped: list[int] = []
    label_ids = LabelIds(label_field)
    for lineno, line in enumerate(_jsonl_lines(path), 1):
        if not line.strip():
            continue
        record = _record(line, path, lineno, (text_field, label_field), fields_from)
        label = record_label(record, label_field, path, lineno)
        if label not in index:
            said = "" if isinstance(record[label_field], str) else " (labels are class names)"
            raise DataError(
                f"{path}:{lineno}: label '{label}' is not in the label list{said}",
                f"known labels: {', '.join(labels)}; fix the record or the labels file",
            )
        label_ids.check(record, label, path, lineno)
        given = record.get("id")
        rid = f"{id_prefix or path.name}:{lineno}" if given is None else str(given)
        if rid in ids:
            if given is None:  # not a duplicate: this record has no id
                raise DataError(
                    f"{path}:{lineno}: this record has no id, and the name it gets, '{rid}', "
                    f"is the id of line {ids[rid]}",
                    f"give line {lineno} an id of its own",
                )
            if ids[rid] in named:  # not a duplicate: the earlier one has no id
                raise DataError(
                    f"{path}:{lineno}: id '{rid}' is also the name given to line {ids[rid]}, "
                    "which has no id",
                    f"give line {ids[rid]} an id of its own",
                )
            raise DataError(
                f"{path}:{lineno}: id '{rid}' repeats the record of line {ids[rid]}",
                "a record was duplicated or two files were merged; keep one of them",
            )
        ids[rid] = lineno
        if given is None:
            named.add(lineno)
        text = model_text(record[text_field], join_spaced_syllables=join_spaced_syllables)
        if not text.strip():
            if not skip_blank:
                raise DataError(
                    f"{path}:{lineno}: the '{text_field}' field is blank",
                    "an evaluation item needs a text; fix or remove the record",
                )
            skipped.append(lineno)
            continue
        out.append(Example(rid, text, index[label], f"{path}:{lineno}"))
    warn_left_out(path, f"record(s) with a blank '{text_field}' left out of training", skipped)
    if not out:
        what = f"every record's '{text_field}' is blank" if skipped else "it is empty or blank"
        raise DataError(
            f"{path}: holds no records ({what})",
            "restore the file (`tibnlp data list` names a dataset's changed files), or "
            "fill it: one JSON object per line",
        )
    return out


def record_labels(
    path: Path, text_field: str, label_field: str, fields_from: str = ""
) -> list[tuple[int, str]]:
    """(line, label) of every record of a JSONL file, the label as `read_jsonl` reads it; a
    bad line names the file and line. For a set whose label list is its training labels."""
    out = []
    for lineno, line in enumerate(_jsonl_lines(path), 1):
        if line.strip():
            record = _record(line, path, lineno, (text_field, label_field), fields_from)
            out.append((lineno, record_label(record, label_field, path, lineno)))
    return out


def read_checked_splits(
    name: str,
    files: dict[str, Path],
    labels: list[str],
    text_field: str,
    label_field: str,
    join_spaced_syllables: bool = True,
    fields_from: str = "",
) -> dict[str, list[Example]]:
    """A set's splits (`read_splits`) with the checks across them: no id in two splits, and a
    warning for a class no training record has."""
    splits = read_splits(files, labels, text_field, label_field, join_spaced_syllables, fields_from)
    check_ids_across_splits(name, files, splits)
    warn_classes_not_in_train(name, files, splits, labels)
    return splits


def read_splits(
    files: dict[str, Path],
    labels: list[str],
    text_field: str,
    label_field: str,
    join_spaced_syllables: bool = True,
    fields_from: str = "",
) -> dict[str, list[Example]]:
    """Each split's records (`read_jsonl`); a blank text is left out of training only, where
    an evaluation split refuses it. A record without an id is named by its file's name and
    line, and its split's where two split files share a name (train/data.jsonl and
    dev/data.jsonl: both "data-1" was one id in two splits)."""
    names = [path.name for path in files.values()]
    distinct = len(set(names)) == len(names)
    return {
        split: read_jsonl(
            path,
            labels,
            text_field,
            label_field,
            join_spaced_syllables,
            skip_blank=split == "train",
            id_prefix=path.name if distinct else f"{split}:{path.name}",
            fields_from=fields_from,
        )
        for split, path in files.items()
    }


def _jsonl_lines(path: Path) -> list[str]:
    """The lines of a JSONL file, ended by LF, CRLF or a lone CR (`text_lines`: line numbers
    as an editor shows them), each without a byte-order mark at its start: Windows editors
    write one, and two such files joined hold one inside."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        lineno = len(text_lines(raw[: exc.start].decode("utf-8") + "x"))
        raise DataError(
            f"{path}:{lineno}: invalid UTF-8 ({exc.reason})",
            "save the file as UTF-8, or restore it",
        ) from exc
    return [line.removeprefix("\ufeff") for line in text_lines(text)]


# The hint for a line holding only "[" or "{": a JSON document written indented (a list of
# records, or one record over several lines) where JSON Lines wants one record per line.
INDENTED_JSON = (
    "the file is indented JSON, not JSON Lines: write one record per line, e.g. "
    "pandas' df.to_json(path, orient='records', lines=True, force_ascii=False)"
)


def _record(
    line: str, path: Path, lineno: int, fields: tuple[str, str], fields_from: str = ""
) -> dict[str, Any]:
    """One JSONL line as a record holding `fields` (text, label), the text a string; else an
    error naming the file, the line and what the record holds instead (and, with
    `fields_from`, the file where other field names are set)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DataError(
            f"{path}:{lineno}: not valid JSON ({exc.msg}, column {exc.colno})",
            INDENTED_JSON
            if line.strip() in ("[", "{")
            else "one JSON object per line; a line cut short or two records on one line: fix "
            "or restore the file",
        ) from exc
    if not isinstance(record, dict):
        raise DataError(
            f"{path}:{lineno}: expected a JSON object, found {type(record).__name__}",
            'one object per line, e.g. {"id": "...", "text": "...", "label": "..."}',
        )
    text_field, label_field = fields
    for key in fields:
        if key not in record:
            other = (
                f", or name your fields in {fields_from} (text_field: ..., label_field: ...)"
                if fields_from
                else ", or restore the file"
            )
            raise DataError(
                missing_field(f"{path}:{lineno}", key, record),
                f"each record needs '{text_field}' (the text) and '{label_field}' (the class "
                f"name); rename the field{other}",
            )
    if not isinstance(record[text_field], str):
        raise DataError(
            f"{path}:{lineno}: the '{text_field}' field is not a string "
            f"({type(record[text_field]).__name__})",
            "give the text as a JSON string, or remove the record",
        )
    return record


def missing_field(where: str, key: str, record: dict[str, Any]) -> str:
    """What a record without field `key` is told at `where` ("FILE:LINE"): the fields it has
    instead, so a renamed field shows."""
    has = listed([repr(name) for name in record], 8) or "none"
    return f"{where}: the record has no '{key}' field (it has: {has})"


def warn_classes_not_in_train(
    name: str, files: dict[str, Path] | Path, splits: dict[str, list[Example]], labels: list[str]
) -> None:
    """A class with validation or test items but no training item: the classifier cannot
    learn it, so each of them is scored wrong. Said (a warning, not an error: a set may hold
    such a class on purpose), naming the file and the first such record."""
    trained = {e.label for e in splits.get("train", [])}
    for split in ("validation", "test"):
        unseen: dict[int, str] = {}
        for example in splits.get(split, []):
            if example.label not in trained:
                unseen.setdefault(example.label, example.id)
        if unseen:
            where = files[split] if isinstance(files, dict) else files
            classes = ", ".join(f"'{labels[c]}' (first: id '{rid}')" for c, rid in unseen.items())
            print(
                f"warning: dataset '{name}': {where} ({split}) holds class(es) that no "
                f"training record has: {classes}; the classifier cannot predict them, so "
                "these items score as errors",
                file=sys.stderr,
                flush=True,
            )


def check_ids_across_splits(
    name: str, files: dict[str, Path], splits: dict[str, list[Example]]
) -> None:
    """An id in two splits is one record evaluated on what it trained on (a split was cut
    twice or files were merged): refused, naming both files. Two texts under one id are
    refused too (an id names one record), with the advice for ids numbered per split."""
    seen: dict[str, tuple[str, Example]] = {}
    for split, examples in splits.items():
        for example in examples:
            other, first = seen.setdefault(example.id, (split, example))
            if other == split:
                continue
            where = f"dataset '{name}': id '{example.id}' is in both {files[other]} ({other})"
            if first.text == example.text:
                raise DataError(
                    f"{where} and {files[split]} ({split})",
                    "each record belongs to one split; remove it from one of the files",
                )
            raise DataError(
                f"{where} and {files[split]} ({split}), naming two different texts",
                "ids must be unique across the splits (numbered per split? prefix them, "
                "e.g. 'train-0', 'test-0'), or leave the ids out: a record without one is "
                "named by its file and line",
            )


def warn_left_out(where: object, what: str, lines: list[int]) -> None:
    """One warning for the records a reader left out, naming their first lines."""
    if lines:
        shown = ", ".join(map(str, lines[:10])) + (" ..." if len(lines) > 10 else "")
        print(f"warning: {where}: {len(lines)} {what} (line {shown})", file=sys.stderr, flush=True)
