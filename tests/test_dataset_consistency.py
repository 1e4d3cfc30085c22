"""A record's two label fields agree, and no id sits in two splits (datasets that were edited
or merged by hand)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.ft_fixtures import make_data_dir
from tibnlp.data.labelled import read_jsonl
from tibnlp.data.tasks import load_dataset
from tibnlp.errors import DataError


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), "utf-8")
    return path


def test_a_label_id_given_to_two_labels_is_refused(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "train.jsonl",
        [
            {"id": "a", "text": "ཀ", "label": "A", "label_id": 0},
            {"id": "b", "text": "ཁ", "label": "B", "label_id": 0},
        ],
    )
    # was: loaded, record b trained as B while its label_id said A
    with pytest.raises(DataError, match=r"train.jsonl:2: label_id 0 is label 'B' here and 'A'"):
        read_jsonl(path, ["A", "B"], "text", "label")


def test_a_label_with_two_label_ids_is_refused(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "train.jsonl",
        [
            {"id": "a", "text": "ཀ", "label": "B", "label_id": 1},
            {"id": "b", "text": "ཁ", "label": "A", "label_id": 0},
            {"id": "c", "text": "ག", "label": "B", "label_id": "1"},
        ],
    )
    with pytest.raises(DataError, match=r"train.jsonl:3: label 'B' has label_id \"1\", and 1 on"):
        read_jsonl(path, ["A", "B"], "text", "label")


def test_any_consistent_numbering_or_none_loads(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "t.jsonl",
        [
            {"id": "a", "text": "ཀ", "label": "B", "label_id": 1},  # 1-based ids
            {"id": "b", "text": "ཁ", "label": "A"},
            {"id": "c", "text": "ག", "label": "A", "label_id": 2},
            {"id": "d", "text": "ང", "label": "B", "label_id": 1},
        ],
    )
    assert [e.label for e in read_jsonl(path, ["A", "B"], "text", "label")] == [1, 0, 0, 1]


def test_sets_labelled_by_id_are_not_cross_checked(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", [{"id": "a", "text": "ཀ", "label": "A", "label_id": "B"}])
    assert [e.label for e in read_jsonl(path, ["A", "B"], "text", "label_id")] == [1]


def test_an_id_in_two_splits_names_both_files(tmp_path: Path, monkeypatch) -> None:
    root = make_data_dir(tmp_path / "data")
    monkeypatch.setenv("TIBNLP_DATA", str(root))
    train = root / "tncc" / "tncc_title_train.jsonl"
    test = root / "tncc" / "tncc_title_test.jsonl"
    first_train = json.loads(train.read_text("utf-8").splitlines()[0])
    lines = test.read_text("utf-8").splitlines()
    lines[2] = json.dumps({**json.loads(lines[2]), "id": first_train["id"]})
    test.write_text("\n".join(lines) + "\n", "utf-8")
    # was: loaded; the record was scored on what it trained on
    with pytest.raises(DataError) as err:
        load_dataset("tncc")
    said = str(err.value)
    assert f"id '{first_train['id']}' is in both" in said
    assert "tncc_title_train.jsonl (train)" in said and "tncc_title_test.jsonl (test)" in said


@pytest.mark.parametrize(
    "name, file",
    [
        ("tncc", "tncc/tncc_title_train.jsonl"),
        ("tusa", "tusa/tusa_train.jsonl"),
        ("wcm_bo", "wcm_bo/wcm_bo_train.jsonl"),
        ("shajiu_cls14", "shajiu_cls14/shajiu_cls14_train.jsonl"),
    ],
)
def test_real_datasets_pass_both_checks(require_data, name: str, file: str) -> None:
    require_data(file)
    data = load_dataset(name)
    assert all(data.splits[s] for s in ("train", "validation", "test"))


def test_fudan_zip_documents_keep_unicode_line_separators(tmp_path: Path, monkeypatch) -> None:
    import zipfile

    from tests.ft_fixtures import LABELS
    from tibnlp.data.tasks import load_tncc

    root = make_data_dir(tmp_path / "data")
    monkeypatch.setenv("TIBNLP_DATA", str(root))
    lines = [f"{LABELS[i % 3]}\tབོད ཀྱི ཡི གེ {i}" for i in range(20)]
    lines[3] = f"{LABELS[0]}\tབོད ཀྱི\u2028ཡི གེ\x0cགསར"  # one document, one line
    (root / "tncc_document").mkdir()
    with zipfile.ZipFile(root / "tncc_document" / "TNCC.zip", "w") as zf:
        zf.writestr("corpus/document-tibetan.txt", "\n".join(lines) + "\n")
    data = load_tncc("document")
    # before: split at U+2028 and the form feed, "line 4: expected 'Label<TAB>text'"
    assert sum(len(s) for s in data.splits.values()) == 20
