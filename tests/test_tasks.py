"""Labelled-set loaders: the real TNCC split, the missing document task, bad records."""

from __future__ import annotations

import json
import zipfile

import pytest

from tests.ft_fixtures import LABELS, make_data_dir, make_word_segmented_set
from tibnlp.data.labelled import model_text
from tibnlp.data.tasks import (
    classification_datasets,
    load_advts,
    load_dataset,
    load_tncc,
)
from tibnlp.errors import DataError
from tibnlp.evaluation.leakage import unseen_indices


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    root = make_data_dir(tmp_path / "data")
    monkeypatch.setenv("TIBNLP_DATA", str(root))
    return root


def test_real_tncc_titles_have_the_published_split(require_data) -> None:
    require_data("tncc/tncc_title_train.jsonl")
    data = load_tncc("title")
    assert {s: len(v) for s, v in data.splits.items()} == {
        "train": 7422,
        "validation": 927,
        "test": 927,
    }
    assert len(data.labels) == 12 and data.labels[0] == "Politics"
    assert data.source_form == "spaced_syllables"
    first = data.splits["train"][0]
    assert first.text == "བྲག་ཡེར་པ" and data.labels[first.label] == "Tourism"
    # SOURCE.md: 89 of the 927 test titles also occur in train
    assert len(unseen_indices(data.texts("train"), data.texts("test"))) == 927 - 89


def test_real_advts_has_gold_labels_and_originals(require_data) -> None:
    require_data("advts/advts_tncc_title.jsonl")
    adv = load_advts("tncc")
    assert len(adv.splits["adversarial"]) == len(adv.splits["original"]) == 345
    assert adv.labels == load_tncc("title").labels


def test_model_text_joins_spaced_syllables_and_unifies_tsheg() -> None:
    spaced = "བོད ཀྱི སློབ གྲྭ"
    assert model_text(spaced) == "བོད་ཀྱི་སློབ་གྲྭ"
    assert model_text("བོད\u0f0cཀྱི་སློབ་གྲྭ") == model_text(spaced)


def test_word_segmented_text_keeps_its_syllables() -> None:
    """In word-segmented text (shajiu_news_culture) a space that is not after a tsheg splits
    a particle off its syllable: "དྲ་བ འི" is the one syllable "བའི", not "བ་འི"."""
    words = "མི་དམངས་ དྲ་བ འི་ འཕྲིན། ཚེས་ ༢༥ ཉིན་ 12"
    assert model_text(words, join_spaced_syllables=False) == "མི་དམངས་དྲ་བའི་འཕྲིན། ཚེས་ ༢༥ ཉིན་ 12"
    assert model_text(words) == "མི་དམངས་དྲ་བ་འི་འཕྲིན། ཚེས་ ༢༥་ཉིན་ 12"  # the TNCC rule
    trimmed = model_text(words, "tsheg-trimmed", join_spaced_syllables=False)
    assert trimmed == "མི་དམངས་དྲ་བའི་འཕྲིན། ཚེས་ ༢༥ ཉིན་ 12"


def test_a_word_segmented_set_is_not_tsheg_joined(data_dir) -> None:
    from tibnlp.training.finetune import texts

    make_word_segmented_set(data_dir)
    data = load_dataset("shajiu_news_culture")
    assert data.source_form == "word_segmented" and not data.join_spaced_syllables
    raw = json.loads(
        (data_dir / "tncc" / "tncc_title_test.jsonl").read_text("utf-8").split("\n")[1]
    )
    expected = raw["text"].replace(" ", "\u0f0b") + "འི"
    assert data.splits["test"][1].text == expected
    assert texts(data, "test", "tsheg-trimmed")[1] == expected  # the default input form too
    assert load_tncc("title").join_spaced_syllables  # spaced syllables are joined


def test_real_word_segmented_set(require_data) -> None:
    require_data("shajiu_news_culture/shajiu_news_culture_test.jsonl")
    data = load_dataset("shajiu_news_culture")
    first = data.splits["test"][0].text
    assert first.startswith("མི་དམངས་དྲ་བའི་འཕྲིན།")  # SOURCE.md: "མི་དམངས་ དྲ་བ འི་ འཕྲིན།"
    texts = [e.text for split in data.splits.values() for e in split]
    assert not any("\u0f0bའི\u0f0b" in t for t in texts)


def test_document_task_absent_says_what_to_download(data_dir) -> None:
    with pytest.raises(DataError) as err:
        load_tncc("document")
    assert "tncc_document" in err.value.message
    assert "FudanNLP/Tibetan-Classification" in (err.value.hint or "")


def test_document_task_from_the_fudan_zip(data_dir) -> None:
    folder = data_dir / "tncc_document"
    folder.mkdir()
    lines = [f"{LABELS[i % 3]}\tབོད ཀྱི ཡི གེ {i}" for i in range(20)]
    with zipfile.ZipFile(folder / "Tibetan News Classification Corpus.zip", "w") as zf:
        zf.writestr("corpus/document-tibetan.txt", "\n".join(lines) + "\n")
    data = load_tncc("document")
    assert [len(data.splits[s]) for s in ("train", "validation", "test")] == [16, 2, 2]
    assert data.name == "tncc-document" and data.splits["train"][1].label == 1
    # `finetune classify --dataset tncc_document` (a name its error hints list) read only
    # JSONL files and labels.json: "labels.json is missing", with a hint to put the zip there
    by_name = load_dataset("tncc_document")
    assert by_name.name == data.name and by_name.splits == data.splits


@pytest.mark.parametrize(("count", "empty"), [(3, "test"), (5, "validation"), (7, "validation")])
def test_a_fudan_zip_too_small_for_every_split_is_refused(data_dir, count, empty) -> None:
    """Cut 8:1:1 and rounded, 5 to 7 documents leave validation empty with a test item: the
    run tokenised, trained a whole epoch and died in its first evaluation with a bare
    `ValueError: attempt to get argmax of an empty sequence`."""
    from tibnlp.data.tncc_document import MIN_ZIP_DOCUMENTS

    folder = data_dir / "tncc_document"
    folder.mkdir()
    lines = [f"{LABELS[i % 3]}\tབོད ཀྱི ཡི གེ {i}" for i in range(count)]
    with zipfile.ZipFile(folder / "Tibetan News Classification Corpus.zip", "w") as zf:
        zf.writestr("document-tibetan.txt", "\n".join(lines) + "\n")
    with pytest.raises(DataError, match=rf"{count} document\(s\), too few ") as err:
        load_tncc("document")
    assert f"({empty} would be empty; it takes at least {MIN_ZIP_DOCUMENTS})" in err.value.message


def test_a_fudan_zip_document_without_model_text_is_named_by_its_line(data_dir) -> None:
    """A document of closing shads only passes the loader but is no text to a tsheg-trimmed
    classifier: refused in test, it was named "id 'tncc-document-00019'", an id of no file,
    where JSONL records are named FILE:LINE."""
    from tests.ft_fixtures import make_vocab
    from tibnlp.data.collate import encode_counting_cuts
    from tibnlp.text.vocab import Vocabulary
    from tibnlp.training.finetune_splits import drop_textless, texts

    folder = data_dir / "tncc_document"
    folder.mkdir()
    lines = [f"{LABELS[i % 3]}\tབོད ཀྱི ཡི གེ {i}" for i in range(20)]
    lines[19] = f"{LABELS[0]}\t།"  # the last line: in the test split
    archive = folder / "Tibetan News Classification Corpus.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("document-tibetan.txt", "\n".join(lines) + "\n")
    data = load_tncc("document")
    vocab = Vocabulary.load(make_vocab(data_dir.parent / "vocab"))
    encoded = {
        s: encode_counting_cuts(vocab, texts(data, s, "tsheg-trimmed"), 16) for s in data.splits
    }
    with pytest.raises(DataError, match="1 test record") as err:
        drop_textless(data, vocab, "tsheg-trimmed", encoded)
    assert err.value.message.endswith(f"{archive}!document-tibetan.txt:20")


def test_unknown_task_and_dataset(data_dir) -> None:
    with pytest.raises(DataError, match="unknown TNCC task 'summary'"):
        load_tncc("summary")
    with pytest.raises(DataError, match="unknown dataset 'nope'"):
        load_dataset("nope")
    assert "tusa" in classification_datasets() and "tncc_document" not in classification_datasets()


def test_label_not_in_label_list_names_file_and_line(data_dir) -> None:
    path = data_dir / "tncc" / "tncc_title_validation.jsonl"
    lines = path.read_text("utf-8").splitlines()
    lines[2] = json.dumps({"id": "x", "label": "Sports", "text": "ཀ ཁ"})
    path.write_text("\n".join(lines) + "\n", "utf-8")
    with pytest.raises(DataError, match=r"tncc_title_validation.jsonl:3: label 'Sports'"):
        load_tncc("title")


def test_missing_split_file_is_a_clear_error(data_dir) -> None:
    (data_dir / "tncc" / "tncc_title_test.jsonl").unlink()
    with pytest.raises(DataError, match=r"tncc_title_test.jsonl is missing"):
        load_tncc("title")


def test_a_damaged_labels_file_names_file_and_line(data_dir) -> None:
    (data_dir / "tncc" / "labels.json").write_text('["Politics",\n "Economics"', "utf-8")
    with pytest.raises(DataError, match=r"labels.json:2: not valid JSON"):
        load_tncc("title")
