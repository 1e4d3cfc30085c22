"""Robustness to how a text ends: the closing-mark normalisation and the shad flip rate."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.ft_fixtures import make_data_dir, make_vocab, tiny_textcnn
from tibnlp.config import load_config
from tibnlp.data.collate import encode_texts
from tibnlp.data.labelled import model_text
from tibnlp.data.tasks import load_tncc
from tibnlp.errors import DataError
from tibnlp.evaluation.predict import Predictor
from tibnlp.evaluation.robustness import SUFFIXES, flip_rate, suffix_flip_rates, typed
from tibnlp.text.normalize import normalize, strip_closing_marks
from tibnlp.text.vocab import Vocabulary
from tibnlp.training.finetune import run_finetune

TSHEG, SHAD = "\u0f0b", "\u0f0d"
TITLE = "སློབ་གྲྭ་དགེ་རྒན"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("བཀྲ་ཤིས་བདེ་ལེགས།", "བཀྲ་ཤིས་བདེ་ལེགས"),
        ("བཀྲ་ཤིས་བདེ་ལེགས་", "བཀྲ་ཤིས་བདེ་ལེགས"),
        ("བཀྲ་ཤིས། ", "བཀྲ་ཤིས"),
        ("ཡག་པོ་རེད་ང་།", "ཡག་པོ་རེད་ང"),  # the tsheg kept before a shad after ང goes too
        ("དེ་ནི། བཀྲ་ཤིས༎", "དེ་ནི། བཀྲ་ཤིས"),  # only the end: inner shads are text
        ("།", ""),
        ("བཀྲ་ཤིས", "བཀྲ་ཤིས"),
    ],
)
def test_strip_closing_marks(raw: str, expected: str) -> None:
    assert strip_closing_marks(normalize(raw)) == expected


def test_closing_marks_give_identical_ids(tmp_path: Path) -> None:
    vocab = Vocabulary.load(make_vocab(tmp_path / "vocab"))
    spaced = TITLE.replace(TSHEG, " ")  # the TNCC form
    typed = [
        spaced,
        TITLE,
        TITLE + SHAD,
        TITLE + TSHEG,
        TITLE + TSHEG + SHAD,
        TITLE + " " + SHAD,
        spaced + SHAD,
        TITLE + "\u0f0c" + SHAD,  # non-breaking tsheg
        TITLE + SHAD + SHAD,
    ]
    ids = encode_texts(vocab, [model_text(t, "tsheg-trimmed") for t in typed], 50)
    assert all(row == ids[0] for row in ids)
    # the untrimmed form does see the shad: what the trimming is for
    kept = encode_texts(vocab, [model_text(t, "tsheg") for t in (TITLE, TITLE + SHAD)], 50)
    assert kept[0] != kept[1]
    with pytest.raises(DataError, match="unknown model input form"):
        model_text(TITLE, "trimmed")


def test_flip_rate_counts_changed_predictions() -> None:
    assert flip_rate([0, 1, 2, 3], [0, 2, 2, 0]) == 0.5
    assert flip_rate([], []) == 0.0
    with pytest.raises(ValueError, match="3 predictions before, 2 after"):
        flip_rate([0, 1, 2], [0, 1])

    # a "model" that answers 1 for texts ending with a shad, else by length parity
    def predict(texts: list[str]) -> tuple[list[int], list[int]]:
        return [1 if t.endswith(SHAD) else len(t) % 2 for t in texts], [0] * len(texts)

    texts = ["ཀ", "ཀཁ", "ཀཁག", "ཀཁགང"]  # parities 1, 0, 1, 0: two of four flip to 1
    rates = suffix_flip_rates(predict, texts, predict(texts)[0])
    assert set(rates) == {f"{name}_flip_{x}" for name in SUFFIXES for x in ("rate", "excluded")}
    assert rates["shad_flip_rate"] == 0.5
    assert rates["tsheg_flip_rate"] == 1.0  # a tsheg shifts every parity
    assert rates["shad_flip_excluded"] == rates["tsheg_flip_excluded"] == 0


def test_a_text_whose_suffix_is_cut_off_is_left_out_of_the_flip_rate() -> None:
    """A suffix past the read length is never read: the unchanged answer says nothing about
    robustness, so such a text is counted beside the rate, not as "not flipped" in it."""
    read = 3  # a "model" reading 3 characters: the suffix of a text of 3 or more is cut off

    def predict(texts: list[str]) -> tuple[list[int], list[int]]:
        seen = [t[:read] for t in texts]
        return [1 if t.endswith(SHAD) else 0 for t in seen], [max(0, len(t) - read) for t in texts]

    texts = ["ཀ", "ཀཁ", "ཀཁག", "ཀཁགང"]  # the first two read with their suffix, flipping
    rates = suffix_flip_rates(predict, texts, predict(texts)[0])
    assert rates["shad_flip_rate"] == 1.0 and rates["shad_flip_excluded"] == 2
    every = suffix_flip_rates(predict, texts[2:], [0, 0])  # no text read with its suffix
    assert math.isnan(every["shad_flip_rate"]) and every["shad_flip_excluded"] == 2


def test_a_shad_after_nga_is_typed_with_a_tsheg() -> None:
    """Tibetan writes a tsheg between ང and a shad (ང་།); after other letters none."""
    seen: list[str] = []

    def predict(texts: list[str]) -> tuple[list[int], list[int]]:
        seen.extend(texts)
        return [0] * len(texts), [0] * len(texts)

    suffix_flip_rates(predict, ["བོད་སྐད", "རྒྱ་ཁང", "ཁང་"], [0, 0, 0])
    shad, tsheg = seen[:3], seen[3:]
    assert shad == ["བོད་སྐད" + SHAD, "རྒྱ་ཁང" + TSHEG + SHAD, "ཁང་" + SHAD]
    assert tsheg == ["བོད་སྐད" + TSHEG, "རྒྱ་ཁང" + TSHEG, "ཁང་" + TSHEG]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """One tiny TextCNN per input form, trained by `run_finetune` on the synthetic titles."""
    tmp = tmp_path_factory.mktemp("robust")
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIBNLP_DATA", str(make_data_dir(tmp / "data")))
        vocab = make_vocab(tmp / "vocab")
        for form in ("tsheg", "tsheg-trimmed"):
            overrides = tiny_textcnn(vocab, tmp / form, f"finetune.text_form={form}")
            cfg = load_config(None, overrides)
            out[form] = run_finetune(cfg, "tncc")
        out["test_texts"] = load_tncc("title").texts("test")
    return out


def test_shad_flip_rate(trained) -> None:
    """The reported rate is what a user of `tibnlp predict` sees: the saved classifier's
    answers for the raw test titles with and without a final shad."""
    texts = trained["test_texts"]
    for form in ("tsheg", "tsheg-trimmed"):
        seed = trained[form].seeds[0]
        predictor = Predictor(seed.directory)
        assert predictor.meta.text_form == form
        plain = [p["prediction"] for p in predictor.predict(texts)]
        for name, suffix in SUFFIXES.items():
            ended = [p["prediction"] for p in predictor.predict([typed(t, suffix) for t in texts])]
            expected = sum(a != b for a, b in zip(plain, ended, strict=True)) / len(texts)
            assert seed.metrics["test"][f"{name}_flip_rate"] == pytest.approx(expected)
    # trimming closing marks makes the classifier blind to them
    trimmed = trained["tsheg-trimmed"]
    assert trimmed.aggregate["test"]["shad_flip_rate"][0] == 0.0
    assert trimmed.aggregate["test"]["tsheg_flip_rate"][0] == 0.0


def test_shad_flip_rate_leaves_out_texts_whose_shad_is_not_read(tmp_path, monkeypatch) -> None:
    """A classifier reading 4 pieces never reads the shad after most test titles: the rate is
    over the titles read with it, as `tibnlp predict` answers them, the others counted."""
    monkeypatch.setenv("TIBNLP_DATA", str(make_data_dir(tmp_path / "data", (30, 12, 12))))
    flags = ["finetune.max_len=6", "finetune.text_form=tsheg", "finetune.batch_size=8"]
    overrides = tiny_textcnn(make_vocab(tmp_path / "vocab"), tmp_path / "runs", *flags)
    seed = run_finetune(load_config(None, overrides), "tncc").seeds[0]
    predictor = Predictor(seed.directory)
    texts = load_tncc("title").texts("test")
    shad = [typed(t, SHAD) for t in texts]
    read = [i for i, cut in enumerate(predictor.encode(shad)[1]) if not cut]
    assert 0 < len(read) < len(texts)  # some titles are read with their shad, not all
    plain = [p["prediction"] for p in predictor.predict([texts[i] for i in read])]
    ended = [p["prediction"] for p in predictor.predict([shad[i] for i in read])]
    flips = sum(a != b for a, b in zip(plain, ended, strict=True))
    assert seed.metrics["test"]["shad_flip_rate"] == pytest.approx(flips / len(read))
    assert seed.metrics["test"]["shad_flip_excluded"] == len(texts) - len(read)
