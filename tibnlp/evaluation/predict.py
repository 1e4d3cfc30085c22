"""Inference with a fine-tuned classifier directory (`tibnlp predict`) and for evaluation.

Texts go through `tibnlp.data.labelled.model_text`, the function training used, in the input form
the classifier records, so every Unicode-equivalent spelling of a text (NFC or not, U+0F0C or
U+0F0B, syllables separated by spaces or by tsheg, with or without a closing shad) becomes the
same ids and gets the same prediction.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from tibnlp.data.class_names import BadLabel, class_name
from tibnlp.data.collate import encode_counting_cuts, pad_batch
from tibnlp.data.labelled import missing_field, model_text
from tibnlp.errors import ConfigError, DataError
from tibnlp.fsutil import atomic_write_text, check_file_path, text_lines
from tibnlp.models.attention.dynamic import per_text_routing
from tibnlp.models.classifier_io import ClassifierMeta, load_classifier, read_length
from tibnlp.text.vocab import Vocabulary


@torch.no_grad()
def predict_proba(
    model: nn.Module,
    ids: Sequence[Sequence[int]],
    batch_size: int = 128,
    pad_id: int = 0,
    routing: Literal["batch", "per_text"] = "batch",
) -> np.ndarray:
    """Class probabilities [n, num_labels], in input order; the model is left in eval mode.
    `routing`: how batch-rule dynamic heads route (`finetune.eval_routing`)."""
    model.eval()
    device = next(model.parameters()).device
    out = []
    with per_text_routing(model) if routing == "per_text" else nullcontext():
        for start in range(0, len(ids), batch_size):
            input_ids, mask = pad_batch(ids[start : start + batch_size], pad_id)
            logits = model(input_ids.to(device), mask.to(device)).float()
            out.append(torch.softmax(logits, dim=-1).cpu().numpy())
    if not out:
        return np.zeros((0, 0), dtype=np.float32)
    return np.concatenate(out)


DEVICES = ("auto", "cpu", "cuda")


def inference_device(name: str) -> torch.device:
    """Where a classifier predicts: `auto` on the GPU when one is visible (where fine-tuning
    evaluated it), else the CPU; `cuda` without a GPU is refused, not run on the CPU."""
    if name not in DEVICES:
        raise ConfigError(f"device {name!r} is none of {', '.join(DEVICES)}")
    cuda = torch.cuda.is_available()
    if name == "cuda" and not cuda:
        raise ConfigError(
            "device cuda asked but torch sees no GPU",
            "use --device cpu (or auto), or check CUDA_VISIBLE_DEVICES and the GPU driver",
        )
    return torch.device("cuda" if cuda and name != "cpu" else "cpu")


class Predictor:
    """A loaded classifier directory: weights, labels, vocabulary, max_len, text form; on
    `device` (`inference_device`: the CPU unless asked)."""

    def __init__(self, directory: Path, device: str = "cpu") -> None:
        self.device = inference_device(device)  # refused before the weights are read
        directory = Path(directory)
        if directory.is_file():  # e.g. the classifier's model.safetensors or classifier.yaml
            raise DataError(
                f"model directory {directory} is a file, not a classifier folder",
                f"give the folder that holds classifier.yaml, e.g. --model {directory.parent}"
                if directory.name in ("classifier.yaml", "model.safetensors")
                else "give a classifier folder written by `tibnlp finetune`",
            )
        if not directory.is_dir():
            raise DataError(f"model directory {directory} does not exist")
        seeds = sorted(
            p.name for p in directory.glob("seed-*") if (p / "classifier.yaml").is_file()
        )
        if seeds and not (directory / "classifier.yaml").exists():
            # a `tibnlp finetune` result folder: one classifier per seed, not one to load
            raise DataError(
                f"{directory} holds the classifiers of {len(seeds)} seed(s) "
                f"({', '.join(seeds)}), not one classifier",
                f"give one of them, e.g. --model {directory / seeds[0]}",
            )
        self.model, self.meta = load_classifier(directory)
        self.model.to(self.device)
        self.vocab = Vocabulary.load(directory)
        check_vocab(self.vocab, self.meta, directory)

    def encode(self, texts: Sequence[str]) -> tuple[list[list[int]], list[int]]:
        """The ids the classifier reads of each text (any spelling), and the pieces each text
        lost to the cut at its read length (0: none), as fine-tuning encodes them."""
        form, join = self.meta.text_form, self.meta.join_spaced_syllables
        inputs = [model_text(t, form, join) for t in texts]
        return encode_counting_cuts(self.vocab, inputs, read_length(self.meta))

    def proba(self, texts: Sequence[str], batch_size: int = 128) -> np.ndarray:
        """Class probabilities [n, len(meta.labels)] of any spelling of each text."""
        return self.proba_of_ids(self.encode(texts)[0], batch_size)

    def proba_of_ids(self, ids: Sequence[Sequence[int]], batch_size: int = 128) -> np.ndarray:
        return predict_proba(self.model, ids, batch_size, self.vocab.pad_id, self.meta.eval_routing)

    def predict(self, texts: Sequence[str], batch_size: int = 128) -> list[dict[str, Any]]:
        return self.rows(self.proba(texts, batch_size))

    def rows(self, probs: np.ndarray) -> list[dict[str, Any]]:
        """`prediction` and `probabilities` of each row of class probabilities."""
        labels = self.meta.labels
        return [
            {
                "prediction": labels[int(row.argmax())],
                "probabilities": {
                    name: round(float(p), 6) for name, p in zip(labels, row, strict=True)
                },
            }
            for row in probs
        ]


def mean_proba(
    directories: Sequence[Path], texts: Sequence[str], batch_size: int = 256
) -> tuple[np.ndarray, list[str]]:
    """The ensemble of several classifiers (e.g. one system's seeds): the mean of their class
    probabilities [n, classes], and their common label order."""
    if not directories:
        raise DataError("no classifier directories to average")
    total, labels = None, None
    for directory in directories:
        predictor = Predictor(directory)
        if labels is not None and predictor.meta.labels != labels:
            raise DataError(
                f"{directory}: its labels differ from {directories[0]}'s",
                "average classifiers of one dataset",
            )
        labels = predictor.meta.labels
        probs = predictor.proba(texts, batch_size)
        total = probs if total is None else total + probs
    assert total is not None and labels is not None
    return total / len(directories), labels


def check_vocab(vocab: Any, meta: ClassifierMeta, directory: Path) -> None:
    if vocab.sha256 != meta.vocab_sha256:
        raise DataError(
            f"{directory}: the vocabulary files (sha256 {vocab.sha256[:12]}) are not the ones "
            f"the classifier was trained with ({meta.vocab_sha256[:12]})",
            "copy the classifier directory whole; do not replace its vocabulary files",
        )


def read_inputs(source: str, text_field: str = "text") -> list[dict[str, Any]]:
    """The records of `source` (see `numbered_inputs`), without their line numbers."""
    return [record for _, record in numbered_inputs(source, text_field).records]


@dataclass
class Inputs:
    """What `numbered_inputs` read: the input's name, its records with their line numbers,
    and the field that holds each record's text."""

    name: str
    records: list[tuple[int, dict[str, Any]]]
    text_field: str

    def texts(self) -> list[str]:
        return [record[self.text_field] for _, record in self.records]


PLAIN_TEXT_FIELD = "text"  # the field a plain-text line becomes


def numbered_inputs(source: str, text_field: str = "text") -> Inputs:
    """The input's records, each with its line number: JSONL records with a string
    `text_field` (kept whole, e.g. ids), or plain text one per line (each line a record
    `{"text": ..., "line": N}` whatever `text_field` is); '-': stdin.

    JSONL is recognised by a `.jsonl` suffix or a first non-empty line starting with '{'.
    Blank lines are skipped; a plain-text record keeps its `line` number, so the output can
    be matched to the input although it has fewer lines. A record without `text_field` is
    refused naming the file, the line and the fields it has (a set's own field names)."""
    if source == "-":
        stdin = sys.stdin
        # bytes, not the text layer: under a C locale it turns invalid bytes into lone
        # surrogates, which SentencePiece cannot encode (a traceback, not an error)
        buffer = getattr(stdin, "buffer", None)
        raw = (
            buffer.read() if buffer is not None else stdin.read().encode("utf-8", "surrogateescape")
        )
        name = "<stdin>"
        lines = _utf8_lines(raw, name)
    else:
        path = Path(source)
        if path.is_dir():
            raise DataError(
                f"input {path} is a folder, not a file of texts",
                "give a JSONL or plain-text file (one text per line), or - for stdin",
            )
        if not path.exists():  # a pipe (`-i <(head in.jsonl)`, /dev/stdin) is read as a file
            raise DataError(f"input file {path} does not exist")
        name = str(path)
        try:
            raw = path.read_bytes()
        except OSError as exc:  # unreadable (permissions), or a socket
            raise DataError(f"cannot read input {path}: {exc.strerror or exc}") from exc
        lines = _utf8_lines(raw, name)
    first = next((ln for ln in lines if ln.strip()), "")
    jsonl = name.endswith(".jsonl") or first.lstrip().startswith("{")
    if not jsonl and first.lstrip().startswith("["):
        _refuse_json_array(lines, name)
    if not jsonl:
        numbered = enumerate(lines, 1)
        plain = [(n, {PLAIN_TEXT_FIELD: line, "line": n}) for n, line in numbered if line.strip()]
        return Inputs(name, plain, PLAIN_TEXT_FIELD)
    records = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(
                f"{name}:{lineno}: not valid JSON ({exc.msg})",
                "JSONL holds one whole JSON object per line (not pretty-printed), "
                'e.g. {"id": "a", "text": "..."}',
            ) from exc
        _check_text(record, text_field, f"{name}:{lineno}")
        records.append((lineno, record))
    return Inputs(name, records, text_field)


def _check_text(record: object, text_field: str, where: str) -> None:
    """A JSONL record holds its text as a string in `text_field`; else an error at `where`
    ("FILE:LINE") saying what it holds instead."""
    if not isinstance(record, dict):
        raise DataError(
            f"{where}: expected a JSON object, found {type(record).__name__}",
            f'one object per line, e.g. {{"id": "a", "{text_field}": "..."}}',
        )
    if text_field not in record:
        raise DataError(
            missing_field(where, text_field, record),
            f"name the field that holds the text with --text-field (read: '{text_field}', "
            "the field the classifier was trained on unless told otherwise), or rename it",
        )
    text = record[text_field]
    if not isinstance(text, str):
        raise DataError(
            f"{where}: the '{text_field}' field is not a string ({type(text).__name__})",
            "give the text as a JSON string",
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone \ud800-\udfff escape: no character
        raise DataError(
            f"{where}: the '{text_field}' field holds an unpaired surrogate escape "
            f"({exc.object[exc.start : exc.end]!a}), not a character",
            "write the character itself, or its escape as a surrogate pair",
        ) from exc


def _refuse_json_array(lines: list[str], name: str) -> None:
    """A JSON array of records (a `.json` export) read as plain text made every line of it,
    brackets and keys included, a text to predict, and the output looked like predictions."""
    try:
        whole = json.loads("\n".join(lines))
    except json.JSONDecodeError:
        return  # plain text that starts with '['
    if isinstance(whole, list):
        raise DataError(
            f"{name} is a JSON array, not JSONL (one JSON object per line) or plain text",
            "write one record per line, e.g. jq -c '.[]' FILE > FILE.jsonl",
        )


def _utf8_lines(raw: bytes, name: str) -> list[str]:
    """The lines of UTF-8 input; a byte-order mark (Windows editors write one) is dropped, so
    it neither hides a JSONL file's first '{' nor joins the first text.

    Lines end at '\n', '\r\n' or '\r' only, not at every break `str.splitlines` knows: JSON
    strings may hold U+2028 or U+0085 raw (`json.dumps(ensure_ascii=False)`, which writes
    `predict`'s own output, leaves them so), and a record split there was refused as invalid
    JSON; in plain text they (and a form feed) shifted the line numbers after them."""
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DataError(f"{name}:{line}: invalid UTF-8 ({exc.reason})", "save it as UTF-8") from exc
    return text_lines(text)


def _class_of(label: object) -> str:
    """A gold label as fine-tuning names its class (1.0 is "1", NFC); as written otherwise."""
    try:
        return class_name(label)
    except BadLabel:
        return str(label)


@dataclass
class Predicted:
    """What `predict_file` did: `count` records predicted from `source` (its name), the
    lines of records with no text once read as the model reads it (blank JSONL text, or only
    punctuation and marks: predicted from no text at all), and how many texts (and pieces)
    were cut at the classifier's read length."""

    count: int
    meta: ClassifierMeta
    source: str
    blank_lines: list[int]
    # `label` values of the records that are none of the classifier's classes: the texts of
    # another dataset (a WCM article given to a TUSA classifier), or the wrong classifier
    foreign_labels: list[str] = field(default_factory=list)
    # texts longer than the classifier's read length (`read_length` tokens, [CLS] and [SEP]
    # included), and the pieces cut off them: text the prediction never read
    cut_texts: int = 0
    cut_tokens: int = 0
    read_length: int = 0
    # lines whose text the vocabulary knows none of (all [UNK]): not Tibetan, or another script
    unknown_lines: list[int] = field(default_factory=list)
    device: str = "cpu"  # where the classifier ran


def predict_file(
    model_dir: Path,
    source: str,
    output: Path | None = None,
    batch_size: int = 128,
    device: str = "cpu",
    text_field: str | None = None,
    label_field: str | None = None,
) -> Predicted:
    """Predict every input; write JSON lines to `output` (atomically) or stdout (None or
    '-'): each input record as it was (a gold label stays the gold label) plus `prediction` and
    `probabilities` (replaced where the record already had them). A bad `output` path or
    `device` is refused before the model is loaded.

    JSONL records hold their text in `text_field` and their gold label, if any, in
    `label_field`; None: the fields of the set the classifier was trained on (`text` and
    `label` for a classifier that records none), so that set's own files predict as they are."""
    if output is not None and str(output) == "-":  # stdout, as '-' is stdin for `source`
        output = None
    if output is not None:
        check_file_path(output)
    for flag, value in (("--text-field", text_field), ("--label-field", label_field)):
        if value is not None and not value.strip():
            raise ConfigError(f"{flag} is blank", "name a field of the input records")
    predictor = Predictor(model_dir, device)
    meta = predictor.meta
    inputs = numbered_inputs(source, text_field or meta.text_field)
    name, numbered = inputs.name, inputs.records
    records = [record for _, record in numbered]
    gold_field = label_field or meta.label_field
    known = set(meta.labels)
    gold = (_class_of(r[gold_field]) for r in records if r.get(gold_field) is not None)
    foreign = sorted({label for label in gold if label not in known})
    ids, dropped = predictor.encode(inputs.texts())
    numbers, vocab = [line for line, _ in numbered], predictor.vocab
    # no text once read as the model reads it: blank, or only punctuation, marks and spaces
    blank = [n for n, row in zip(numbers, ids, strict=True) if not vocab.text_ids(row)]
    # text, but not one piece of it the vocabulary knows (Latin, say)
    unknown = [n for n, row in zip(numbers, ids, strict=True) if vocab.knows_none(row)]
    preds = predictor.rows(predictor.proba_of_ids(ids, batch_size))
    pairs = zip(records, preds, strict=True)
    lines = (json.dumps({**r, **p}, ensure_ascii=False) for r, p in pairs)
    if output is None:
        for line in lines:
            sys.stdout.write(line + "\n")
    else:
        atomic_write_text(Path(output), (line + "\n" for line in lines))
    return Predicted(
        len(records),
        predictor.meta,
        name,
        blank,
        foreign,
        unknown_lines=unknown,
        cut_texts=sum(n > 0 for n in dropped),
        cut_tokens=sum(dropped),
        read_length=read_length(predictor.meta),
        device=predictor.device.type,
    )
