"""`tibnlp predict` as a demanding user meets it: texts longer than the classifier reads, an
edited classifier.yaml, `--model` naming a file, `-o -`, line breaks inside records, and a
JSON array given for JSONL."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.ft_fixtures import CLASS_SYLLABLES, trained_textcnn
from tibnlp.cli.main import app
from tibnlp.data.labelled import model_text
from tibnlp.errors import DataError
from tibnlp.evaluation.predict import Predictor, predict_file, read_inputs
from tibnlp.text.vocab import Vocabulary

LONG = " ".join(CLASS_SYLLABLES[0] * 30)  # 120 syllables: beyond a title classifier's 50
SHORT = "རྒྱལ ཁབ སྲིད"


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory) -> Path:
    return trained_textcnn(tmp_path_factory.mktemp("qa_predict"))


def _said(result) -> str:
    return " ".join(result.stderr.split())


def test_predict_says_how_many_texts_were_cut(classifier_dir: Path, tmp_path: Path) -> None:
    """A text longer than the classifier's read length (max_len) was cut without a word, while
    fine-tuning notes every cut: the prediction is of the first 48 pieces only."""
    predictor = Predictor(classifier_dir)
    meta = predictor.meta
    pieces = len(predictor.vocab.encode(model_text(LONG, meta.text_form)))
    assert meta.max_len == 50 and pieces > 48
    src = tmp_path / "in.txt"
    src.write_text(f"{SHORT}\n{LONG}\n{SHORT}\n", "utf-8")
    out = tmp_path / "pred.jsonl"
    result = CliRunner().invoke(
        app, ["predict", "--model", str(classifier_dir), "-i", str(src), "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    said = _said(result)
    assert said.count("longer than the classifier's read length") == 1, said
    assert "warning: 1 of 3 text(s) of" in said and "read length (50 tokens)" in said, said
    assert f"{pieces - 48} tokens were cut off and not read" in said, said
    assert len(out.read_text("utf-8").splitlines()) == 3  # still predicted, only said
    done = predict_file(classifier_dir, str(src), tmp_path / "again.jsonl")
    assert (done.cut_texts, done.cut_tokens, done.read_length) == (1, pieces - 48, 50)


def test_nothing_cut_says_nothing(classifier_dir: Path, tmp_path: Path) -> None:
    src = tmp_path / "in.txt"
    src.write_text(f"{SHORT}\n", "utf-8")
    result = CliRunner().invoke(app, ["predict", "--model", str(classifier_dir), "-i", str(src)])
    assert result.exit_code == 0, result.output
    assert "read length" not in _said(result)
    assert predict_file(classifier_dir, str(src), tmp_path / "o.jsonl").cut_texts == 0


def _edited(classifier_dir: Path, folder: Path, old: str, new: str) -> Path:
    shutil.copytree(classifier_dir, folder)
    path = folder / "classifier.yaml"
    text = path.read_text("utf-8")
    assert old in text
    path.write_text(text.replace(old, new, 1), "utf-8")
    return folder


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        # max_len 1 read every piece but the last ([CLS] pieces[:-1] [SEP]), -3 all but 5
        ("\nmax_len: 50\n", "\nmax_len: 1\n", r"'classifier.max_len': must be >= 3"),
        ("\nmax_len: 50\n", "\nmax_len: -3\n", r"'classifier.max_len': must be >= 3"),
        # a class named twice lost its probability in the output dict (it kept the last)
        ("\n- Economics\n", "\n- Politics\n", r"'classifier.labels': names 'Politics' twice"),
        # refused only at the first text, without the file's name
        (
            "\ntext_form: tsheg-trimmed\n",
            "\ntext_form: bogus\n",
            r"'classifier.text_form': 'bogus' is not allowed",
        ),
    ],
)
def test_an_edited_classifier_yaml_is_refused_naming_the_key(
    classifier_dir: Path, tmp_path: Path, old: str, new: str, message: str
) -> None:
    """Values classifier.yaml may not hold were read as they were: predictions of a garbled
    input, or a probabilities dict missing a class, with exit 0."""
    folder = _edited(classifier_dir, tmp_path / "edited", old, new)
    with pytest.raises(DataError, match=message) as err:
        Predictor(folder)
    assert "edited/classifier.yaml: damaged" in str(err.value)
    assert "fine-tune again" in str(err.value.hint)


def test_no_labels_is_refused_naming_the_key(classifier_dir: Path, tmp_path: Path) -> None:
    folder = _edited(
        classifier_dir,
        tmp_path / "edited",
        "\nlabels:\n- Politics\n- Economics\n- Education\n",
        "\nlabels: []\n",
    )
    with pytest.raises(DataError, match=r"'classifier.labels': must name at least one class"):
        Predictor(folder)


@pytest.mark.parametrize("name", ["model.safetensors", "classifier.yaml"])
def test_a_file_given_for_the_model_folder_is_named_as_such(
    classifier_dir: Path, tmp_path: Path, name: str
) -> None:
    """`--model DIR/model.safetensors` said "model directory ... does not exist" of a file
    that exists."""
    src = tmp_path / "in.txt"
    src.write_text(f"{SHORT}\n", "utf-8")
    model = classifier_dir / name
    result = CliRunner().invoke(app, ["predict", "--model", str(model), "-i", str(src)])
    assert isinstance(result.exception, DataError), result.exception
    assert f"{model} is a file, not a classifier folder" in str(result.exception)
    assert f"--model {classifier_dir}" in str(result.exception.hint)


def test_output_dash_is_stdout(
    classifier_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`-o -` (as `-i -` reads stdin) wrote a file named '-' and nothing to stdout."""
    monkeypatch.chdir(tmp_path)
    src = tmp_path / "in.txt"
    src.write_text(f"{SHORT}\n", "utf-8")
    result = CliRunner().invoke(
        app, ["predict", "--model", str(classifier_dir), "-i", str(src), "-o", "-"]
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["text"] for r in rows] == [SHORT] and "prediction" in rows[0]
    assert not (tmp_path / "-").exists()
    assert "-> -" not in _said(result)


def test_unicode_line_breaks_inside_a_record_do_not_split_it(tmp_path: Path) -> None:
    """Lines were split at every break `str.splitlines` knows: a JSONL record holding U+2028
    or U+0085 raw (as `json.dumps(ensure_ascii=False)`, predict's own output, writes them)
    was refused as "not valid JSON (Unterminated string ...)", and a form feed in plain text
    made two texts, shifting every line number after it."""
    src = tmp_path / "in.jsonl"
    rows = [
        {"id": "a", "text": "ཀ\u2028ཁ"},
        {"id": "b", "text": "ག\x85ང"},
        {"id": "c", "text": "ཅ"},
    ]
    src.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    assert read_inputs(str(src)) == rows
    plain = tmp_path / "in.txt"
    plain.write_bytes("ཀ\x0cཁ\r\nག\u2029ང\r\n\r\nཅ".encode())
    assert read_inputs(str(plain)) == [
        {"text": "ཀ\x0cཁ", "line": 1},
        {"text": "ག\u2029ང", "line": 2},
        {"text": "ཅ", "line": 4},  # the line number an editor shows
    ]
    old_mac = tmp_path / "cr.txt"  # a lone carriage return still ends a line
    old_mac.write_bytes("ཀ\rཁ\r".encode())
    assert read_inputs(str(old_mac)) == [{"text": "ཀ", "line": 1}, {"text": "ཁ", "line": 2}]


def test_predict_reads_its_own_output_back(classifier_dir: Path, tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "a", "text": "ཀ\u2028ཁ"}, ensure_ascii=False) + "\n")
    first, second = tmp_path / "1.jsonl", tmp_path / "2.jsonl"
    predict_file(classifier_dir, str(src), first)
    assert predict_file(classifier_dir, str(first), second).count == 1
    assert json.loads(second.read_text("utf-8"))["text"] == "ཀ\u2028ཁ"


def test_a_json_array_is_refused_not_predicted_line_by_line(
    classifier_dir: Path, tmp_path: Path
) -> None:
    """A `.json` array of records was read as plain text: '[', '  {"text": "ཀ"},' and ']'
    each predicted as a text, exit 0."""
    src = tmp_path / "records.json"
    src.write_text(json.dumps([{"text": "ཀ"}, {"text": "ཁ"}], indent=2), "utf-8")
    out = tmp_path / "pred.jsonl"
    result = CliRunner().invoke(
        app, ["predict", "--model", str(classifier_dir), "-i", str(src), "-o", str(out)]
    )
    assert isinstance(result.exception, DataError), result.exception
    assert "records.json is a JSON array, not JSONL" in str(result.exception)
    assert "jq -c" in str(result.exception.hint)
    assert not out.exists()
    plain = tmp_path / "bracket.txt"  # plain text that merely starts with '['
    plain.write_text("[1] ཀ\n", "utf-8")
    assert read_inputs(str(plain)) == [{"text": "[1] ཀ", "line": 1}]


def test_a_pretty_printed_record_gets_a_hint(tmp_path: Path) -> None:
    src = tmp_path / "one.json"
    src.write_text(json.dumps({"text": "ཀ"}, indent=2), "utf-8")
    with pytest.raises(DataError, match=r"one.json:1: not valid JSON") as err:
        read_inputs(str(src))
    assert "one whole JSON object per line" in str(err.value.hint)


def test_vocabulary_helper_matches_predictor(classifier_dir: Path) -> None:
    """`Predictor.encode` frames texts as fine-tuning does: [CLS] pieces [SEP], cut at 50."""
    predictor = Predictor(classifier_dir)
    vocab = Vocabulary.load(classifier_dir)
    ids, dropped = predictor.encode([SHORT, LONG])
    assert ids[0][0] == vocab.cls_id and ids[0][-1] == vocab.sep_id
    assert len(ids[1]) == 50 and dropped[0] == 0 and dropped[1] > 0


def test_a_pipe_given_as_input_is_read(tmp_path: Path) -> None:
    """`-i <(head -100 big.jsonl)` (a /dev/fd pipe) said "input file /dev/fd/63 does not
    exist": only regular files were read."""
    import os

    read_end, write_end = os.pipe()
    try:
        os.write(write_end, f'{{"id": "a", "text": "{SHORT}"}}\n'.encode())
        os.close(write_end)
        assert read_inputs(f"/dev/fd/{read_end}") == [{"id": "a", "text": SHORT}]
    finally:
        os.close(read_end)
    with pytest.raises(DataError, match="does not exist"):
        read_inputs(str(tmp_path / "missing.jsonl"))
