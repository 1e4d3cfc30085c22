"""`tibnlp predict`: JSONL/plain/stdin input, equivalent spellings, a tampered vocabulary, a
damaged classifier folder, folders given for files."""

from __future__ import annotations

import json
import shutil
import unicodedata
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.ft_fixtures import (
    make_data_dir,
    make_vocab,
    make_word_segmented_set,
    tiny_textcnn,
    trained_textcnn,
)
from tibnlp.cli.main import app
from tibnlp.config import load_config
from tibnlp.errors import DataError
from tibnlp.evaluation.predict import Predictor, predict_file, read_inputs
from tibnlp.training.finetune import run_finetune


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory) -> Path:
    return trained_textcnn(tmp_path_factory.mktemp("predict"))


def test_equivalent_spellings_get_the_same_prediction(classifier_dir) -> None:
    tsheg = "སློབ་གྲྭ་དགེ་རྒན་\u0f43ི་\u0f73"  # with precomposed (non-NFC) letters
    spellings = [
        tsheg,
        unicodedata.normalize("NFC", tsheg),  # NFC decomposes U+0F43 and U+0F73
        tsheg.replace("\u0f0b", "\u0f0c"),  # non-breaking tsheg
        tsheg.replace("\u0f0b", " "),  # TNCC form: syllables separated by spaces
    ]
    assert len(set(spellings)) == 4
    preds = Predictor(classifier_dir).predict(spellings)
    assert all(p == preds[0] for p in preds)
    assert sum(preds[0]["probabilities"].values()) == pytest.approx(1.0, abs=1e-4)


def test_jsonl_keeps_records_and_plain_text_works(classifier_dir, tmp_path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(
        json.dumps({"id": "a", "text": "རྒྱལ ཁབ སྲིད"}, ensure_ascii=False)
        + "\n\n"
        + json.dumps({"id": "b", "text": "དཔལ་འབྱོར"}, ensure_ascii=False)
        + "\n",
        "utf-8",
    )
    out = tmp_path / "out" / "pred.jsonl"
    done = predict_file(classifier_dir, str(src), out)
    count, meta = done.count, done.meta
    rows = [json.loads(line) for line in out.read_text("utf-8").splitlines()]
    assert count == 2 and [r["id"] for r in rows] == ["a", "b"]
    assert (
        set(rows[0]["probabilities"]) == set(meta.labels) and rows[0]["prediction"] in meta.labels
    )
    plain = tmp_path / "in.txt"
    plain.write_text("རྒྱལ ཁབ སྲིད\n\nདཔལ་འབྱོར\n", "utf-8")
    assert read_inputs(str(plain)) == [  # a blank line skipped, the input's line numbers kept
        {"text": "རྒྱལ ཁབ སྲིད", "line": 1},
        {"text": "དཔལ་འབྱོར", "line": 3},
    ]


def test_cli_reads_stdin(classifier_dir) -> None:
    result = CliRunner().invoke(
        app, ["predict", "--model", str(classifier_dir), "--input", "-"], input="སློབ གྲྭ\n"
    )
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout.strip().splitlines()[-1])
    assert row["text"] == "སློབ གྲྭ" and "prediction" in row


def test_bad_inputs_are_clear_errors(classifier_dir, tmp_path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        predict_file(classifier_dir, str(tmp_path / "missing.txt"))
    with pytest.raises(DataError, match="does not exist"):
        Predictor(tmp_path / "no-model")
    latin = tmp_path / "latin.txt"
    latin.write_bytes("ཀ\n".encode() + b"b\xe9\n")
    with pytest.raises(DataError, match=r"latin.txt:2: invalid UTF-8"):
        read_inputs(str(latin))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ཀ"}\n{"txt": "ཁ"}\n', "utf-8")
    with pytest.raises(
        DataError, match=r"bad.jsonl:2: the record has no .text. field \(it has: .txt.\)"
    ):
        read_inputs(str(bad))


def test_a_replaced_vocabulary_is_refused(classifier_dir, tmp_path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(classifier_dir, copy)
    other = make_vocab(tmp_path / "other-vocab", size=50)
    shutil.copy2(other / "spm.model", copy / "spm.model")
    with pytest.raises(DataError, match="not the ones the classifier was trained with"):
        Predictor(copy)


def test_a_gold_label_in_the_input_is_kept(classifier_dir, tmp_path) -> None:
    """Scoring `predict`'s output against its input must compare the model with the gold
    labels, not with itself: the prediction has a field of its own."""
    src = tmp_path / "gold.jsonl"
    record = {"text": "རྒྱལ ཁབ སྲིད", "label": "gold-class", "probabilities": {"stale": 1.0}}
    src.write_text(json.dumps(record, ensure_ascii=False) + "\n", "utf-8")
    out = tmp_path / "pred.jsonl"
    meta = predict_file(classifier_dir, str(src), out).meta
    row = json.loads(out.read_text("utf-8"))
    assert row["label"] == "gold-class" and row["prediction"] in meta.labels
    assert set(row["probabilities"]) == set(meta.labels)  # a stale field is replaced


@pytest.mark.parametrize("size", ["0", "-4"])
def test_predict_batch_size_must_be_positive(classifier_dir: Path, size: str, tmp_path) -> None:
    """--batch-size 0 ended in `ValueError: range() arg 3 must not be zero` (a traceback)."""
    src = tmp_path / "in.txt"
    src.write_text("རྒྱལ་ཁབ\n", "utf-8")
    out = tmp_path / "pred.jsonl"
    args = ["predict", "--model", str(classifier_dir), "-i", str(src), "-o", str(out)]
    result = CliRunner().invoke(app, [*args, "--batch-size", size])
    assert result.exit_code == 2, result.exception
    assert "--batch-size" in result.output
    assert not out.exists()


def test_a_word_segmented_classifier_reads_words_as_it_was_trained(tmp_path) -> None:
    """Fine-tuned on a word-segmented set, the classifier records that its spaces are not
    syllable boundaries, and `predict` drops them ("དངུ ལ" is the syllable "དངུལ") instead
    of joining them with tsheg as for TNCC titles."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIBNLP_DATA", str(make_word_segmented_set(make_data_dir(tmp_path / "data"))))
        cfg = load_config(None, tiny_textcnn(make_vocab(tmp_path / "vocab"), tmp_path / "runs"))
        directory = run_finetune(cfg, "shajiu_news_culture").seeds[0].directory
    predictor = Predictor(directory)
    assert predictor.meta.join_spaced_syllables is False
    segmented, plain, joined = predictor.predict(["བོད་ཀྱི་ དངུ ལ", "བོད་ཀྱི་དངུལ", "བོད་ཀྱི་དངུ་ལ"])
    assert segmented == plain != joined


def _damaged(classifier_dir: Path, folder: Path, name: str, text: str | None) -> Path:
    """A copy of the classifier with file `name` rewritten to `text` (None: cut short)."""
    shutil.copytree(classifier_dir, folder)
    path = folder / name
    if text is None:
        path.write_bytes(path.read_bytes()[:100])
    else:
        path.write_text(text, "utf-8")
    return folder


def test_a_damaged_classifier_folder_is_a_clear_error(classifier_dir, tmp_path) -> None:
    """An edited classifier.yaml raised yaml's ParserError (or a TypeError), truncated weights
    a SafetensorError, weights of another shape torch's RuntimeError: each a traceback."""
    meta = (classifier_dir / "classifier.yaml").read_text("utf-8")
    assert "\nembedding_size: 16\n" in meta
    cases = {
        "bad-yaml": ("classifier.yaml", "labels: [a\n", r"yaml: damaged \(.*yaml:2: invalid YAML"),
        "a-list": ("classifier.yaml", "- a\n", r"classifier.yaml: damaged \(.*must be a mapping"),
        "lacking": (
            "classifier.yaml",
            "format: x\n",
            r"yaml: damaged \(config key 'classifier.enc",
        ),
        "shape": (
            "classifier.yaml",
            meta.replace("\nembedding_size: 16\n", "\nembedding_size: 32\n"),
            r"model.safetensors: weights do not fit .*size mismatch",
        ),
        "truncated": ("model.safetensors", None, r"model.safetensors is corrupt or not a"),
    }
    for folder, (name, text, message) in cases.items():
        directory = _damaged(classifier_dir, tmp_path / folder, name, text)
        with pytest.raises(DataError, match=message) as err:
            Predictor(directory)
        assert f"{folder}/" in str(err.value) and "fine-tune again" in str(err.value.hint)


def test_a_folder_given_for_an_input_or_output_file_is_a_clear_error(
    classifier_dir, tmp_path
) -> None:
    """`-i FOLDER` said the input "does not exist"; `-o FOLDER` raised IsADirectoryError
    after predicting."""
    folder = tmp_path / "folder"
    folder.mkdir()
    with pytest.raises(DataError, match=r"folder is a folder, not a file of texts"):
        read_inputs(str(folder))
    src = tmp_path / "in.txt"
    src.write_text("རྒྱལ་ཁབ\n", "utf-8")
    args = ["predict", "--model", str(classifier_dir), "-i", str(src), "-o", str(folder)]
    result = CliRunner().invoke(app, args)
    assert isinstance(result.exception, DataError), result.exception
    assert f"{folder} is a folder; give a file path" in str(result.exception)
    assert not any(folder.iterdir()) and sorted(p.name for p in tmp_path.iterdir()) == [
        "folder",
        "in.txt",
    ]


def test_undecodable_stdin_and_lone_surrogates_are_clear_errors(classifier_dir, tmp_path) -> None:
    """Cut UTF-8 on stdin (`head -c`) became lone surrogates under a C locale, and so did a
    JSONL `\\ud800` escape: SentencePiece's "Unable to cast Python instance" traceback."""
    args = ["predict", "--model", str(classifier_dir), "--input", "-"]
    result = CliRunner().invoke(app, args, input="ཀ\n".encode() + b"\xe0\xbd\n")
    assert isinstance(result.exception, DataError), result.exception
    assert "<stdin>:2: invalid UTF-8" in str(result.exception)
    src = tmp_path / "escaped.jsonl"
    src.write_text('{"text": "ཀ"}\n{"text": "ཀ\\ud800"}\n', "utf-8")
    with pytest.raises(DataError, match=r"escaped.jsonl:2: the 'text' field holds an unpaired"):
        read_inputs(str(src))


def test_a_byte_order_mark_is_dropped(tmp_path) -> None:
    """A JSONL file saved with a BOM was refused ("Unexpected UTF-8 BOM"), and a plain-text
    one kept U+FEFF in its first text."""
    src = tmp_path / "bom.jsonl"
    src.write_bytes(b"\xef\xbb\xbf" + '{"id": "a", "text": "ཀ"}\n'.encode())
    assert read_inputs(str(src)) == [{"id": "a", "text": "ཀ"}]
    plain = tmp_path / "bom.txt"
    plain.write_bytes(b"\xef\xbb\xbf" + "ཀ ཁ\n".encode())
    assert read_inputs(str(plain)) == [{"text": "ཀ ཁ", "line": 1}]


def test_a_result_folder_names_its_seed_classifiers(classifier_dir) -> None:
    """The folder `tibnlp finetune` prints ("results and classifiers: ...") was refused as
    "not a fine-tuned classifier directory ... give a directory written by tibnlp finetune"."""
    with pytest.raises(DataError, match=r"holds the classifiers of 1 seed\(s\) \(seed-1\)") as err:
        Predictor(classifier_dir.parent)
    assert str(classifier_dir) in str(err.value.hint)


def _predicted_saying(classifier_dir: Path, src: Path, out: Path) -> str:
    """`tibnlp predict` run on `src` into `out` (exit 0); what it said, on one line."""
    result = CliRunner().invoke(
        app, ["predict", "--model", str(classifier_dir), "-i", str(src), "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_nothing_to_predict_and_blank_jsonl_texts_are_warned(classifier_dir, tmp_path) -> None:
    """An empty input and a JSONL record whose text is blank still run (the output keeps one
    line per record), but the user is told: neither is a prediction of a text."""
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", "utf-8")
    result = CliRunner().invoke(
        app,
        ["predict", "--model", str(classifier_dir), "-i", str(empty), "-o", str(tmp_path / "o")],
    )
    assert result.exit_code == 0, result.output
    assert "empty.txt holds no text" in " ".join(result.output.split())
    src = tmp_path / "in.jsonl"
    rows = [{"id": "a", "text": "ཀ"}, {"id": "b", "text": " "}, {"id": "c", "text": ""}]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")
    out = tmp_path / "out.jsonl"
    said = _predicted_saying(classifier_dir, src, out)
    assert "2 record(s) of" in said and "(line 2, 3)" in said, said
    assert [json.loads(x)["id"] for x in out.read_text("utf-8").splitlines()] == ["a", "b", "c"]


def test_texts_of_only_punctuation_are_warned_as_read_from_nothing(
    classifier_dir, tmp_path
) -> None:
    """A line of a shad, a tsheg or a zero-width space is no text once read as the model
    reads it; it was predicted from nothing, silently (only blank text was warned of)."""
    src = tmp_path / "marks.txt"
    src.write_text("།\nརྒྱལ་ཁབ\n་\n\u200b\n", "utf-8")
    out = tmp_path / "out.jsonl"
    said = _predicted_saying(classifier_dir, src, out)
    assert "3 record(s) of" in said and "(line 1, 3, 4)" in said, said
    assert len(out.read_text("utf-8").splitlines()) == 4  # still one line per record


def test_gold_labels_are_read_as_fine_tuning_reads_class_names(classifier_dir, tmp_path) -> None:
    """1.0 is class "1", true is "true", and a Tibetan name in another normalisation is the
    same class: they were warned of as labels of no class of the classifier."""
    folder = tmp_path / "numbered"
    shutil.copytree(classifier_dir, folder)
    meta = folder / "classifier.yaml"
    text = meta.read_text("utf-8")
    nfc = unicodedata.normalize("NFC", "\u0f43\u0f72")
    for old, new in (("Politics", "'1'"), ("Economics", "'true'"), ("Education", nfc)):
        text = text.replace(f"- {old}\n", f"- {new}\n")
    meta.write_text(text, "utf-8")
    src = tmp_path / "gold.jsonl"
    gold = [1.0, True, "\u0f43\u0f72"]  # (U+0F43: a precomposed letter NFC decomposes)
    src.write_text("".join(json.dumps({"text": "ཀ", "label": g}) + "\n" for g in gold), "utf-8")
    assert predict_file(folder, str(src), tmp_path / "out.jsonl").foreign_labels == []
    src.write_text(json.dumps({"text": "ཀ", "label": 2}) + "\n", "utf-8")
    assert predict_file(folder, str(src), tmp_path / "out.jsonl").foreign_labels == ["2"]


def test_an_edited_read_length_past_the_encoders_positions_is_a_damaged_file(
    tmp_path,
) -> None:
    """classifier.yaml's max_len raised past the encoder's model.max_len ended in a
    ValueError traceback at the first long text."""
    from tibnlp.config import to_dict
    from tibnlp.config.model import ModelConfig
    from tibnlp.models.classifier_io import META_FILE, ClassifierMeta, read_meta

    meta = ClassifierMeta("albert", ["a", "b"], 1000, "x", 60, model=ModelConfig(max_len=128))
    (tmp_path / META_FILE).write_text(json.dumps(to_dict(meta)), "utf-8")
    with pytest.raises(DataError, match=r"damaged .*max_len.*past the encoder's model.max_len"):
        read_meta(tmp_path)
    meta.max_len = 128
    (tmp_path / META_FILE).write_text(json.dumps(to_dict(meta)), "utf-8")
    assert read_meta(tmp_path).max_len == 128


def test_text_the_vocabulary_knows_nothing_of_is_warned(classifier_dir, tmp_path) -> None:
    """Latin or digits alone encode to [UNK] only: a prediction of nothing, given silently."""
    src = tmp_path / "mixed.txt"
    src.write_text("hello world\nརྒྱལ ཁབ སྲིད\nabc རྒྱལ\n", "utf-8")
    said = _predicted_saying(classifier_dir, src, tmp_path / "out.jsonl")
    assert "1 record(s) of" in said and "only [UNK] (line 1)" in said, said


def test_predict_device_cuda_without_a_gpu_is_a_clear_error(
    classifier_dir, tmp_path, monkeypatch, capsys
) -> None:
    """`predict` ran on the CPU only; `--device` now chooses. Asked for cuda where torch sees
    no GPU it says so and exits 2, writing nothing, rather than predicting on the CPU."""
    from tibnlp.cli import main as cli_main

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    src, out = tmp_path / "in.txt", tmp_path / "out.jsonl"
    src.write_text("སློབ གྲྭ\n", "utf-8")
    args = ["predict", "--model", str(classifier_dir), "-i", str(src), "-o", str(out)]
    monkeypatch.setattr("sys.argv", ["tibnlp", *args, "--device", "cuda"])
    with pytest.raises(SystemExit) as exit_:
        cli_main.main()
    err = " ".join(capsys.readouterr().err.split())
    assert exit_.value.code == 2, err
    assert "device cuda asked but torch sees no GPU" in err and "--device cpu" in err
    assert "Traceback" not in err and not out.exists()
    for device in ("cpu", "auto"):  # auto: the CPU when there is no GPU
        result = CliRunner().invoke(app, [*args, "--device", device])
        assert result.exit_code == 0, result.output
        assert "on cpu)" in " ".join(result.output.split())
        assert json.loads(out.read_text("utf-8"))["text"] == "སློབ གྲྭ"


@pytest.mark.gpu
def test_predict_on_the_gpu_agrees_with_the_cpu(classifier_dir, tmp_path) -> None:
    """`--device cuda` runs the classifier on the GPU, with the CPU's predictions."""
    texts = ["སློབ གྲྭ དགེ རྒན", "རྒྱལ ཁབ སྲིད", "དཔལ་འབྱོར"]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(texts) + "\n", "utf-8")
    rows = {}
    for device in ("cpu", "cuda"):
        out = tmp_path / f"{device}.jsonl"
        done = predict_file(classifier_dir, str(src), out, device=device)
        assert done.device == device
        rows[device] = [json.loads(line) for line in out.read_text("utf-8").splitlines()]
    for cpu, gpu in zip(rows["cpu"], rows["cuda"], strict=True):
        assert cpu["prediction"] == gpu["prediction"]
        for label, p in cpu["probabilities"].items():
            assert gpu["probabilities"][label] == pytest.approx(p, abs=1e-3)
