"""`tibnlp predict` on a set whose records name their fields otherwise than `text`/`label`: the
classifier records its dataset's fields and predict reads them (or those named with
`--text-field`/`--label-field`), so a set's own files predict as they are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tests.ft_fixtures import LABELS, make_vocab, tiny_textcnn, write_split
from tibnlp.cli.main import app
from tibnlp.config import load_config
from tibnlp.errors import ConfigError, DataError
from tibnlp.evaluation.predict import predict_file
from tibnlp.models.classifier_io import META_FILE, read_meta
from tibnlp.training.finetune import run_finetune


def _write(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), "utf-8")


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines()]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A folder set whose records are {"sentence", "category"} (its dataset.yaml says so), and
    the classifier fine-tuned on it (one epoch of a tiny TextCNN)."""
    tmp = tmp_path_factory.mktemp("fields")
    folder = tmp / "renamed"
    folder.mkdir()
    for split, n, seed in (("train", 45, 1), ("validation", 12, 2), ("test", 12, 3)):
        rows = write_split(folder / f"{split}.jsonl", n, seed, split)
        _write(
            folder / f"{split}.jsonl",
            [{"id": r["id"], "sentence": r["text"], "category": r["label"]} for r in rows],
        )
    (folder / "labels.json").write_text(json.dumps(LABELS), "utf-8")
    fields = {"text_field": "sentence", "label_field": "category"}
    (folder / "dataset.yaml").write_text(yaml.safe_dump(fields), "utf-8")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIBNLP_DATA", str(tmp / "datadir"))
        overrides = tiny_textcnn(make_vocab(tmp / "vocab"), tmp / "runs", "finetune.epochs=1")
        seed = run_finetune(load_config(None, overrides), str(folder)).seeds[0]
    return seed.directory, folder


def test_the_classifier_records_its_sets_fields_and_predict_reads_them(trained, tmp_path) -> None:
    """Predict read `text` and `label` only: the set's own test file was refused."""
    classifier, folder = trained
    meta = read_meta(classifier)
    assert (meta.text_field, meta.label_field) == ("sentence", "category")
    out = tmp_path / "out.jsonl"
    done = predict_file(classifier, str(folder / "test.jsonl"), out)
    rows = _records(out)
    assert done.count == len(rows) == 12 and done.foreign_labels == []
    assert all(r["prediction"] in LABELS and "sentence" in r and "category" in r for r in rows)
    # the gold label is read from the set's label field: a class of no classifier is said
    _write(tmp_path / "other.jsonl", [{"sentence": "རྒྱལ ཁབ", "category": "Sports"}])
    assert predict_file(classifier, str(tmp_path / "other.jsonl"), out).foreign_labels == ["Sports"]


def test_fields_named_on_the_command_line_are_read(trained, tmp_path) -> None:
    classifier, _ = trained
    src = tmp_path / "in.jsonl"
    _write(src, [{"body": "སློབ གྲྭ དགེ རྒན", "gold": "Sports"}, {"body": "དཔལ འབྱོར"}])
    out = tmp_path / "out.jsonl"
    args = ["predict", "--model", str(classifier), "-i", str(src), "-o", str(out)]
    result = CliRunner().invoke(app, [*args, "--text-field", "body", "--label-field", "gold"])
    assert result.exit_code == 0, result.output
    rows = _records(out)
    assert [r["body"] for r in rows] == ["སློབ གྲྭ དགེ རྒན", "དཔལ འབྱོར"]
    assert all(r["prediction"] in LABELS for r in rows)
    assert "Sports" in " ".join(result.output.split())  # the gold field was read
    with pytest.raises(ConfigError, match="--text-field is blank"):
        predict_file(classifier, str(src), out, text_field=" ")


def test_a_record_without_the_text_field_names_the_file_line_key_and_its_keys(
    trained, tmp_path
) -> None:
    classifier, _ = trained
    src = tmp_path / "plain-fields.jsonl"
    _write(src, [{"id": "a", "sentence": "ཀ"}, {"id": "b", "text": "ཁ", "label": "Politics"}])
    out = tmp_path / "out.jsonl"
    with pytest.raises(DataError) as err:
        predict_file(classifier, str(src), out)
    said = err.value.message
    assert f"{src}:2: the record has no 'sentence' field" in said
    assert "'id', 'text', 'label'" in said and "--text-field" in str(err.value.hint)
    assert not out.exists()
    args = ["predict", "--model", str(classifier), "-i", str(src), "-o", str(out)]
    result = CliRunner().invoke(app, args)  # through the command: not zero, nothing written
    assert result.exit_code != 0 and isinstance(result.exception, DataError)
    assert not out.exists()
    result = CliRunner().invoke(app, [*args, "--text-field", "id"])  # named: every record has it
    assert result.exit_code == 0, result.output
    assert [r["id"] for r in _records(out)] == ["a", "b"]


def test_plain_text_and_classifiers_that_record_no_fields(trained, tmp_path) -> None:
    """A plain-text line is still a record {"text", "line"}, whatever the classifier's fields;
    a classifier written before the fields were recorded reads `text` and `label`."""
    classifier, _ = trained
    plain = tmp_path / "in.txt"
    plain.write_text("རྒྱལ ཁབ\n\nདཔལ འབྱོར\n", "utf-8")
    out = tmp_path / "out.jsonl"
    assert predict_file(classifier, str(plain), out).count == 2
    assert [(r["text"], r["line"]) for r in _records(out)] == [("རྒྱལ ཁབ", 1), ("དཔལ འབྱོར", 3)]
    old = tmp_path / "old"
    old.mkdir()
    for item in classifier.iterdir():
        (old / item.name).write_bytes(item.read_bytes())
    saved = yaml.safe_load((old / META_FILE).read_text("utf-8"))
    del saved["text_field"], saved["label_field"]
    (old / META_FILE).write_text(yaml.safe_dump(saved, allow_unicode=True), "utf-8")
    src = tmp_path / "in.jsonl"
    _write(src, [{"text": "རྒྱལ ཁབ", "label": "Sports"}])
    assert predict_file(old, str(src), out).foreign_labels == ["Sports"]
