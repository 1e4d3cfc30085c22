"""Labelled datasets as a user meets them: partial or damaged copies in the data directory, the
TNCC document task's two sources (split files or the FudanNLP zip), and the advice errors give."""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.ft_fixtures import LABELS, make_data_dir
from tibnlp.cli.main import app
from tibnlp.data import manifests
from tibnlp.data.labelled import read_jsonl
from tibnlp.data.manifests import get_manifest, status_ok
from tibnlp.data.tasks import load_classification, load_dataset, load_tncc
from tibnlp.errors import DataError

ZIP = "Tibetan News Classification Corpus.zip"


def _flat(text: str) -> str:
    return " ".join(text.split())


def _zip(path: Path, n: int = 20, member: str = "corpus/document-tibetan.txt") -> Path:
    lines = "".join(f"{LABELS[i % 3]}\tབོད ཀྱི ཡི གེ {i}\n" for i in range(n))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(member, lines)
    return path


def _jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), "utf-8")
    return path


def _records(prefix: str, n: int = 6) -> list[dict]:
    return [{"id": f"{prefix}-{i}", "text": "བོད ཀྱི", "label": LABELS[i % 3]} for i in range(n)]


@pytest.fixture
def doc_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data directory holding the synthetic tncc/ (its labels) and an empty tncc_document/."""
    root = make_data_dir(tmp_path / "data")
    monkeypatch.setenv("TIBNLP_DATA", str(root))
    (root / "tncc_document").mkdir()
    return root / "tncc_document"


def _doc_status() -> str:
    return get_manifest("tncc_document").status()


# --- the TNCC document task: which files it reads, and what `data list` says of them ---


def test_document_split_files_present_are_listed_and_read(doc_dir: Path) -> None:
    for split in ("train", "validation", "test"):
        _jsonl(doc_dir / f"{split}.jsonl", _records(split))
    _zip(doc_dir / ZIP)  # the split files come first: the zip is not read
    status = _doc_status()
    assert status_ok(status) and "train.jsonl" in status, status  # was: "present", files {}
    data = load_tncc("document")
    assert [len(data.splits[s]) for s in ("train", "validation", "test")] == [6, 6, 6]


def test_document_zip_alone_is_read_and_said(doc_dir: Path, capsys) -> None:
    _zip(doc_dir / ZIP)
    assert _doc_status().startswith(f"present: {ZIP}")
    data = load_tncc("document")
    assert [len(data.splits[s]) for s in ("train", "validation", "test")] == [16, 2, 2]
    err = _flat(capsys.readouterr().err)  # was: silent about the zip it cut
    assert f"reading {doc_dir / ZIP} (corpus/document-tibetan.txt), cut in order 8:1:1" in err
    assert "16/2/2" in err


def test_some_split_files_with_a_zip_are_refused_not_replaced_by_the_zip(doc_dir: Path) -> None:
    _zip(doc_dir / ZIP)
    _jsonl(doc_dir / "train.jsonl", _records("train"))
    with pytest.raises(DataError) as err:  # was: the zip's cut, train.jsonl ignored, silently
        load_tncc("document")
    assert "holds train.jsonl but not validation.jsonl, test.jsonl" in err.value.message
    assert f"remove train.jsonl to read {ZIP}" in (err.value.hint or "")
    assert _doc_status() == "partial: missing validation.jsonl, test.jsonl"
    # the hint's second way works: without train.jsonl the zip is read
    (doc_dir / "train.jsonl").unlink()
    assert len(load_tncc("document").splits["test"]) == 2


def test_data_list_says_what_the_document_task_lacks(doc_dir: Path) -> None:
    """Before, its manifest listed no files and any folder was 'present', exit 0."""
    _jsonl(doc_dir / "test.jsonl", _records("test"))
    result = CliRunner().invoke(app, ["data", "list"], env={"COLUMNS": "300"})
    out = _flat(result.output)
    assert result.exit_code == 1, out
    assert "tncc_document in" in out and "partial: missing train.jsonl, validation.jsonl" in out
    assert "hint: tncc_document: Get 'Tibetan News Classification Corpus.zip'" in out
    for split in ("train", "validation"):
        _jsonl(doc_dir / f"{split}.jsonl", _records(split))
    result = CliRunner().invoke(app, ["data", "list", "--no-verify"], env={"COLUMNS": "300"})
    assert "tncc_document" not in _flat(result.output).partition("damaged:")[2]


def test_an_empty_document_folder_is_named_with_what_it_needs(doc_dir: Path) -> None:
    assert _doc_status().startswith("holds none of its files (train.jsonl")
    with pytest.raises(DataError, match=r"has neither train\.jsonl, validation\.jsonl, test"):
        load_tncc("document")


def test_two_zips_are_refused_naming_both(doc_dir: Path) -> None:
    _zip(doc_dir / ZIP)
    _zip(doc_dir / "copy.zip")
    with pytest.raises(DataError, match=r"holds 2 zips \(Tibetan News .*\.zip, copy\.zip\)"):
        load_tncc("document")  # was: the first by name, silently
    assert _doc_status().startswith("ambiguous: 2 archives")


@pytest.mark.parametrize("damage", ["html", "truncated", "crc"])
def test_a_damaged_zip_is_a_data_error_naming_it(doc_dir: Path, damage: str) -> None:
    path = _zip(doc_dir / ZIP, n=200)
    raw = bytearray(path.read_bytes())
    if damage == "html":
        raw = bytearray(b"<html>rate limited</html>")
    elif damage == "truncated":
        raw = raw[: len(raw) // 2]
    else:  # a flipped byte inside the compressed member: its CRC no longer matches
        raw[60] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(DataError) as err:  # was: a BadZipFile traceback
        load_tncc("document")
    assert str(path) in err.value.message
    assert "download the" in (err.value.hint or "")
    assert _doc_status().startswith("damaged: ")


def test_a_mac_resource_fork_in_the_zip_is_not_read(doc_dir: Path) -> None:
    with zipfile.ZipFile(doc_dir / ZIP, "w") as zf:  # "._NAME" also ends with the name
        zf.writestr("__MACOSX/corpus/._document-tibetan.txt", b"\x00\x05\x16\x07\xff\xfe")
        zf.writestr("corpus/document-tibetan.txt", "Politics\tཀ ཁ\n" * 10)
    assert len(load_tncc("document").splits["train"]) == 8  # was: invalid UTF-8 in the fork


def test_a_zip_with_too_few_documents_is_refused(doc_dir: Path) -> None:
    _zip(doc_dir / ZIP, n=3)
    with pytest.raises(DataError, match="3 document"):
        load_tncc("document")  # was: an empty test split


def test_document_labels_missing_everywhere_say_both_places(doc_dir: Path) -> None:
    _zip(doc_dir / ZIP)
    (doc_dir.parent / "tncc" / "labels.json").unlink()
    with pytest.raises(DataError) as err:
        load_tncc("document")
    assert "reads the title task's labels" in err.value.message
    assert f"or put labels.json (the class names in label-id order) in {doc_dir}" in (
        err.value.hint or ""
    )
    (doc_dir / "labels.json").write_text(json.dumps(LABELS), "utf-8")  # the hint's way
    assert load_tncc("document").labels == LABELS


def test_metaphors_text_splits_are_pointed_out(doc_dir: Path) -> None:
    for split in ("train", "validation", "test"):
        (doc_dir / f"{split}.txt").write_text("Politics\tཀ ཁ\n", "utf-8")
    with pytest.raises(DataError) as err:
        load_tncc("document")
    assert "holds test.txt, train.txt, validation.txt" in (err.value.hint or "")


# --- JSONL splits: line endings, byte-order marks, fields, empty files ---


def test_lone_cr_line_ends_and_a_bom_inside_the_file_load(tmp_path: Path) -> None:
    lines = [json.dumps(r, ensure_ascii=False) for r in _records("x", 4)]
    path = tmp_path / "split.jsonl"
    # a Windows file appended to another (its BOM now inside), then old-Mac line ends
    path.write_bytes(("\r".join(lines[:2]) + "\r\ufeff" + "\r".join(lines[2:]) + "\r").encode())
    examples = read_jsonl(path, LABELS, "text", "label")  # was: line 1: not valid JSON
    assert [e.id for e in examples] == ["x-0", "x-1", "x-2", "x-3"]
    path.write_bytes(("\r".join([*lines[:2], "{", lines[3]]) + "\r").encode())
    with pytest.raises(DataError, match=r"split.jsonl:3: not valid JSON"):
        read_jsonl(path, LABELS, "text", "label")  # the line an editor shows


def test_a_missing_field_lists_the_fields_the_record_has(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "split.jsonl", [{"id": "a", "sentence": "ཀ", "label": "Politics"}])
    with pytest.raises(DataError) as err:
        read_jsonl(path, LABELS, "text", "label")
    assert "split.jsonl:1: the record has no 'text' field (it has: 'id', 'sentence', 'label')" in (
        err.value.message
    )
    assert "rename the field" in (err.value.hint or "")


def test_an_empty_split_file_says_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "split.jsonl"
    path.write_text("\n\n", "utf-8")
    with pytest.raises(DataError) as err:
        read_jsonl(path, LABELS, "text", "label")
    assert "split.jsonl: holds no records" in err.value.message
    assert "tibnlp data list" in (err.value.hint or "")


def test_invalid_utf8_names_its_line_in_a_crlf_file(tmp_path: Path) -> None:
    path = tmp_path / "split.jsonl"
    good = json.dumps(_records("x", 1)[0], ensure_ascii=False).encode()
    path.write_bytes(good + b"\r\n" + good.replace(b"x-0", b"x-1") + b"\r\n" + b'{"a": "\xff"}\r\n')
    with pytest.raises(DataError, match=r"split.jsonl:3: invalid UTF-8"):
        read_jsonl(path, LABELS, "text", "label")


def test_a_numeric_label_is_said_to_be_an_id(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "split.jsonl", [{"id": "a", "text": "ཀ", "label": 1}])
    with pytest.raises(DataError, match=r"label '1' is not in the label list \(labels are class"):
        read_jsonl(path, LABELS, "text", "label")


# --- whole datasets: missing files, a class only in test, the advice of errors ---


def test_every_missing_split_file_is_named_at_once(tmp_path: Path, monkeypatch) -> None:
    root = make_data_dir(tmp_path / "data")
    monkeypatch.setenv("TIBNLP_DATA", str(root))
    (root / "tncc" / "tncc_title_validation.jsonl").unlink()
    (root / "tncc" / "tncc_title_test.jsonl").unlink()
    (root / "tncc" / "tncc_title_test.jsonl").symlink_to(tmp_path / "gone.jsonl")
    with pytest.raises(DataError) as err:
        load_tncc("title")
    msg = err.value.message
    assert "lacks tncc_title_validation.jsonl, tncc_title_test.jsonl" in msg, msg
    assert "restore tncc_title_validation.jsonl" in (err.value.hint or "")
    (root / "tncc" / "tncc_title_validation.jsonl").write_text("", "utf-8")
    with pytest.raises(DataError, match=r"tncc_title_test.jsonl is a broken link to .*gone"):
        load_tncc("title")


def test_a_class_only_in_test_is_warned_with_file_and_id(tmp_path, monkeypatch, capsys) -> None:
    root = make_data_dir(tmp_path / "data")
    monkeypatch.setenv("TIBNLP_DATA", str(root))
    train = root / "tncc" / "tncc_title_train.jsonl"
    kept = [r for r in map(json.loads, train.read_text("utf-8").splitlines())]
    _jsonl(train, [r for r in kept if r["label"] != "Education"])
    data = load_tncc("title")
    assert 2 in data.targets("test") and 2 not in data.targets("train")
    err = _flat(capsys.readouterr().err)
    test_file = root / "tncc" / "tncc_title_test.jsonl"
    assert f"{test_file} (test) holds class(es) that no training record has: 'Education'" in err
    assert "(first: id 'test-2')" in err


def test_a_file_name_as_dataset_says_how_to_add_a_set(tmp_path, monkeypatch) -> None:
    """The hint's recipe works: the user's files in a folder, given as ./FOLDER, load."""
    monkeypatch.setenv("TIBNLP_DATA", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError) as err:
        load_dataset("./mine.jsonl")
    hint = err.value.hint or ""
    assert "named by its manifest, not by a file" in err.value.message
    assert "--dataset ./FOLDER" in hint
    own = tmp_path / "mine"
    own.mkdir()
    (own / "labels.json").write_text(json.dumps(LABELS), "utf-8")
    for split in ("train", "validation", "test"):
        _jsonl(own / f"{split}.jsonl", _records(split))
    assert len(load_classification("./mine").splits["test"]) == 6


def test_real_partial_copy_is_listed_and_the_hint_repairs_it(
    require_data, tmp_path: Path, monkeypatch
) -> None:
    """A copy of tusa/ without its test split (the real files linked one by one): loading
    names it and says to run `data list` or to remove the folder and link again; doing that
    gives a complete set."""
    real = require_data("tusa/tusa_test.jsonl").resolve().parent
    root = tmp_path / "data"
    (root / "tusa").mkdir(parents=True)
    for entry in real.iterdir():
        if entry.name != "tusa_test.jsonl":
            (root / "tusa" / entry.name).symlink_to(entry)
    monkeypatch.setenv("TIBNLP_DATA", str(root))
    with pytest.raises(DataError) as err:
        load_dataset("tusa")
    assert f"{root}/tusa/tusa_test.jsonl is missing" in err.value.message
    assert "`tibnlp data list`" in (err.value.hint or "")
    listed = CliRunner().invoke(app, ["data", "list", "--no-verify"], env={"COLUMNS": "300"})
    assert listed.exit_code == 1 and "partial: missing tusa_test.jsonl" in _flat(listed.output)
    shutil.rmtree(root / "tusa")  # the hint's other way: remove the folder, link a copy
    linked = CliRunner().invoke(app, ["data", "link", str(real.parent)])
    assert linked.exit_code == 0, linked.output
    assert os.path.islink(root / "tusa")
    assert len(load_dataset("tusa").splits["test"]) == 1000


def test_a_labels_file_saved_with_a_byte_order_mark_reads(tmp_path) -> None:
    """Windows editors write one; a shipped set's labels.json (e.g. tncc_document's, which has
    no checksum) is read as a folder set's is."""
    path = tmp_path / "labels.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(LABELS).encode())
    assert manifests.read_label_file(path) == LABELS
