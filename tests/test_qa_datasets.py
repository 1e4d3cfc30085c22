"""Labelled sets other than TNCC titles, damaged or altered: a byte-order mark, repeated ids,
blank texts, and classes a split never holds (WCM-bo)."""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.ft_fixtures import LABELS, make_data_dir, make_vocab, tiny_textcnn
from tibnlp.cli.main import app
from tibnlp.config import load_config
from tibnlp.data.labelled import LabelledSet, read_jsonl
from tibnlp.data.tasks import load_advts, load_dataset, load_tncc
from tibnlp.errors import DataError
from tibnlp.training.finetune import run_finetune
from tibnlp.training.finetune_splits import classes_absent


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), "utf-8")
    return path


def test_byte_order_mark_is_dropped_as_predict_does(tmp_path: Path) -> None:
    path = tmp_path / "split.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b'{"id": "a", "text": "\xe0\xbd\x80", "label": "A"}\n')
    examples = read_jsonl(path, ["A"], "text", "label")  # was: "Unexpected UTF-8 BOM"
    assert [(e.id, e.text, e.label) for e in examples] == [("a", "ཀ", 0)]


def test_repeated_id_names_the_file_and_both_lines(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "split.jsonl",
        [
            {"id": "x-0", "text": "ཀ", "label": "A"},
            {"id": "x-1", "text": "ཁ", "label": "A"},
            {"id": "x-0", "text": "ག", "label": "A"},
        ],
    )
    with pytest.raises(DataError, match=r"split.jsonl:3: id 'x-0' repeats the record of line 1"):
        read_jsonl(path, ["A"], "text", "label")  # was: loaded, the record twice


@pytest.mark.parametrize("blank", ["", "   ", "\u3000"])
def test_blank_evaluation_text_names_file_and_line(tmp_path: Path, blank: str) -> None:
    path = _write(
        tmp_path / "test.jsonl",
        [{"id": "a", "text": "ཀ", "label": "A"}, {"id": "b", "text": blank, "label": "A"}],
    )
    with pytest.raises(DataError, match=r"test.jsonl:2: the 'text' field is blank"):
        read_jsonl(path, ["A"], "text", "label")  # was: scored a prediction of no text


def test_blank_training_text_is_left_out_with_a_warning(tmp_path: Path, capsys) -> None:
    path = _write(
        tmp_path / "train.jsonl",
        [
            {"id": "a", "text": "ཀ", "label": "A"},
            {"id": "b", "text": "", "label": "B"},
            {"id": "c", "text": "ཁ", "label": "B"},
        ],
    )
    examples = read_jsonl(path, ["A", "B"], "text", "label", skip_blank=True)
    assert [e.id for e in examples] == ["a", "c"]  # was: "b" trained as an empty text
    err = capsys.readouterr().err
    assert "train.jsonl: 1 record(s) with a blank 'text' left out of training (line 2)" in err


def test_load_dataset_skips_blank_training_texts_and_refuses_blank_test_texts(
    tmp_path: Path, monkeypatch
) -> None:
    root = make_data_dir(tmp_path / "data")
    monkeypatch.setenv("TIBNLP_DATA", str(root))
    train = root / "tncc" / "tncc_title_train.jsonl"
    lines = train.read_text("utf-8").splitlines()
    lines[4] = json.dumps({**json.loads(lines[4]), "text": " "})
    train.write_text("\n".join(lines) + "\n", "utf-8")
    data = load_dataset("tncc")
    assert len(data.splits["train"]) == 89 and "train-4" not in {e.id for e in data.splits["train"]}
    test = root / "tncc" / "tncc_title_test.jsonl"
    lines = test.read_text("utf-8").splitlines()
    lines[1] = json.dumps({**json.loads(lines[1]), "text": ""})
    test.write_text("\n".join(lines) + "\n", "utf-8")
    with pytest.raises(DataError, match=r"tncc_title_test.jsonl:2: the 'text' field is blank"):
        load_dataset("tncc")


def test_classes_absent_from_a_split_are_said_with_the_macro_ceiling() -> None:
    from tibnlp.data.labelled import Example

    def split(labels: list[int]) -> list[Example]:
        return [Example(str(i), "ཀ", y) for i, y in enumerate(labels)]

    names = ["A", "B", "C", "D"]
    data = LabelledSet(
        "x", names, {"train": split([0, 1, 2, 3]), "validation": split([0, 1, 2, 3])}
    )
    data.splits["test"] = split([0, 1, 0])
    note = classes_absent(data)
    assert "validation" not in note
    assert "test: 2 of 4 classes have no item (C, D)" in note and "at most 50%" in note
    data.splits["test"] = split([0, 1, 2, 3])
    assert classes_absent(data) == ""


def test_finetune_notes_classes_a_test_split_lacks(tmp_path: Path, monkeypatch) -> None:
    root = make_data_dir(tmp_path / "data")
    monkeypatch.setenv("TIBNLP_DATA", str(root))
    test = root / "tncc" / "tncc_title_test.jsonl"
    kept = [ln for ln in test.read_text("utf-8").splitlines() if f'"{LABELS[2]}"' not in ln]
    test.write_text("\n".join(kept) + "\n", "utf-8")
    cfg = load_config(
        None,
        [
            f"finetune.vocab={make_vocab(tmp_path / 'vocab')}",
            f"finetune.output={tmp_path / 'runs'}",
            "finetune.encoder=none",
            "finetune.epochs=1",
            "finetune.embedding_size=8",
            "finetune.cnn_channels=4",
            "tracking.enabled=false",
        ],
    )
    result = run_finetune(cfg, "tncc")
    assert f"test: 1 of 3 classes have no item ({LABELS[2]})" in result.notes["classes_absent"]
    # the figure it explains: the absent class scores 0 in the macro mean
    assert result.seeds[0].metrics["test"].per_class[LABELS[2]]["f1-score"] == 0.0


def test_real_wcm_bo_says_its_absent_classes(require_data) -> None:
    require_data("wcm_bo/wcm_bo_test.jsonl")
    data = load_dataset("wcm_bo")
    # SOURCE.md: 890 / 110 / 110; Nature and Economy have no item, Education one (in train)
    assert {s: len(v) for s, v in data.splits.items()} == {
        "train": 890,
        "validation": 110,
        "test": 110,
    }
    note = classes_absent(data)
    assert "test: 3 of 10 classes have no item (Nature, Education, Economy)" in note
    assert "at most 70%" in note


def test_real_shajiu_news_culture_leaves_out_its_blank_training_text(require_data) -> None:
    require_data("shajiu_news_culture/shajiu_news_culture_train.jsonl")
    data = load_dataset("shajiu_news_culture")
    # SOURCE.md: 98 / 12 / 12, and shajiu_news_culture-081 (train) is blank upstream
    assert {s: len(v) for s, v in data.splits.items()} == {
        "train": 97,
        "validation": 12,
        "test": 12,
    }
    assert "shajiu_news_culture-081" not in {e.id for e in data.splits["train"]}


def _fudan_zip(root: Path, body: bytes) -> None:
    folder = root / "tncc_document"
    folder.mkdir()
    with zipfile.ZipFile(folder / "Tibetan News Classification Corpus.zip", "w") as zf:
        zf.writestr("corpus/document-tibetan.txt", body)


def test_fudan_zip_with_bom_crlf_and_an_empty_document(tmp_path: Path, monkeypatch, capsys) -> None:
    root = make_data_dir(tmp_path / "data")
    monkeypatch.setenv("TIBNLP_DATA", str(root))
    lines = [f"{LABELS[i % 3]}\tབོད ཀྱི ཡི གེ {i}" for i in range(21)]
    lines[4] = f"{LABELS[1]}\t "  # a label with no document
    _fudan_zip(root, ("\ufeff" + "\r\n".join(lines) + "\r\n").encode())
    data = load_tncc("document")  # was: line 1 "expected 'Label<TAB>text'" (the BOM)
    assert [len(data.splits[s]) for s in ("train", "validation", "test")] == [16, 2, 2]
    assert "tncc-document-00004" not in {e.id for s in data.splits.values() for e in s}
    assert "1 document(s) with no text left out (line 5)" in capsys.readouterr().err


def test_fudan_zip_with_bad_utf8_names_its_line(tmp_path: Path, monkeypatch) -> None:
    root = make_data_dir(tmp_path / "data")
    monkeypatch.setenv("TIBNLP_DATA", str(root))
    _fudan_zip(root, f"{LABELS[0]}\tཀ\n{LABELS[1]}\t".encode() + b"\xff\n")
    with pytest.raises(DataError, match=r"document-tibetan.txt:2: invalid UTF-8"):
        load_tncc("document")  # was: a bare UnicodeDecodeError traceback


def test_predict_warns_when_records_carry_labels_of_another_dataset(
    tmp_path: Path, monkeypatch
) -> None:
    """A WCM article given to a TUSA classifier gets a TUSA class, confidently: the records'
    own labels, none of the classifier's classes, are the one sign of the mix-up."""
    monkeypatch.setenv("TIBNLP_DATA", str(make_data_dir(tmp_path / "data")))
    cfg = load_config(None, tiny_textcnn(make_vocab(tmp_path / "vocab"), tmp_path / "runs"))
    model = run_finetune(cfg, "tncc").seeds[0].directory
    src = tmp_path / "wcm.jsonl"
    rows = [
        {"id": "w0", "label": "Geography", "text": "ཀ"},
        {"id": "w1", "label": LABELS[0], "text": "ཁ"},
        {"id": "w2", "label": "Health", "text": "ག"},
    ]
    _write(src, rows)
    args = ["predict", "--model", str(model), "-i", str(src), "-o", str(tmp_path / "o.jsonl")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "none of the classifier's classes ('Geography', 'Health';" in said, said
    assert "another dataset than tncc-title" in said
    _write(src, rows[1:2])  # its own dataset's labels: nothing to say
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0 and "warning" not in result.output


@pytest.mark.parametrize(
    ("labels", "said"),
    [
        ([*LABELS, LABELS[0]], f"label '{LABELS[0]}' is listed twice (again at position 3)"),
        ([], "the label list is empty"),
    ],
)
def test_damaged_label_list_is_refused(tmp_path: Path, monkeypatch, labels, said) -> None:
    """A repeated class name mapped its records to its last position: a 4-class classifier
    of 3 classes, a phantom class in every report, and no error."""
    root = make_data_dir(tmp_path / "data")
    monkeypatch.setenv("TIBNLP_DATA", str(root))
    (root / "tncc" / "labels.json").write_text(json.dumps({"labels": labels}), "utf-8")
    with pytest.raises(DataError, match=rf"tncc/labels.json: {re.escape(said)}"):
        load_dataset("tncc")
    (root / "advts" / "labels.json").write_text(
        json.dumps({"advts_tncc_title": {"labels": labels}}), "utf-8"
    )
    with pytest.raises(DataError, match=rf"advts/labels.json: {re.escape(said)}"):
        load_advts("tncc")
