"""`tibnlp export hf` on text the vocabulary does not know: the exported tokenizer gives the ids
tibnlp gives and decodes them to the text tibnlp (SentencePiece) decodes, the unknown piece
shown as the vocabulary's unk surface (" ⁇ "); it decoded as "[UNK]" with a tsheg before it,
or to nothing where special tokens are skipped."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.ft_fixtures import TINY_MODEL, make_vocab
from tibnlp.data.labelled import model_text
from tibnlp.text.syllables import TSHEG
from tibnlp.text.vocab import Vocabulary

tokenizers = pytest.importorskip(
    "tokenizers", reason="reading an exported tokenizer.json needs tokenizers (tibnlp[hf])"
)

# Unknown to the tiny vocabulary (ft_fixtures' syllables only): Latin, CJK, Tibetan letters
# and a shad it never saw; first, inside, last, alone, beside known syllables and tshegs.
TEXTS = [
    "རྒྱལ་ཁབ་abc་སྲིད",
    "abc",
    "日本 རྒྱལ་ཁབ",
    "ཨཨ་ཁབ",
    "རྒྱལ་ཁབ་ཨ་སྲིད།",
    "ཀ ཟ ཁ",
    "རྒྱལ xyz",
    "སློབ་གྲྭ 2024 ཟླ་",
]


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Vocabulary]:
    """A tiny pretraining directory exported with `export_hf`, and its vocabulary."""
    from tibnlp.config import load_config
    from tibnlp.export.hf_model import export_hf
    from tibnlp.models.io import save_pretrained
    from tibnlp.models.pretraining import AlbertForPretraining

    root = tmp_path_factory.mktemp("hf_unknown")
    vocab_dir = make_vocab(root / "vocab")
    vocab = Vocabulary.load(vocab_dir)
    cfg = load_config(None, TINY_MODEL).model
    cfg.vocab_size = vocab.size
    model_dir = save_pretrained(AlbertForPretraining(cfg), cfg, root / "model")
    for item in vocab_dir.iterdir():
        shutil.copy2(item, model_dir / item.name)
    return export_hf(model_dir, root / "hf"), vocab


def _tibnlp_ids(vocab: Vocabulary, text: str) -> list[int]:
    return [vocab.cls_id, *vocab.encode(model_text(text)), vocab.sep_id]


def test_tokenizer_json_encodes_and_decodes_unknown_text_as_sentencepiece(export) -> None:
    out, vocab = export
    tokenizer = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    surface = str(vocab.sp.decode([vocab.unk_id]))  # SentencePiece's own: " ⁇ "
    assert surface.strip() == "\u2047"
    for text in TEXTS:
        ids = tokenizer.encode(text).ids
        assert ids == _tibnlp_ids(vocab, text), text
        assert vocab.unk_id in ids, text  # the case under test
        want = vocab.decode(ids)  # tibnlp's text: SentencePiece's, tshegs restored
        assert surface in want
        assert TSHEG + surface.strip() not in want, text  # the surface's space is no boundary
        assert tokenizer.decode(ids, skip_special_tokens=True) == want, text
        assert tokenizer.decode(ids[1:-1], skip_special_tokens=False) == want, text


def test_transformers_decodes_the_unknown_piece_as_sentencepiece(export) -> None:
    """transformers makes [UNK] special at load (skip_special_tokens=True drops it, as for any
    of its tokenizers); decoded without skipping, the text is tibnlp's."""
    transformers = pytest.importorskip(
        "transformers", reason="loading the export with AutoTokenizer needs transformers"
    )
    out, vocab = export
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    for text in TEXTS:
        ids = tokenizer(text)["input_ids"]
        assert ids == _tibnlp_ids(vocab, text), text
        assert tokenizer.decode(ids[1:-1]) == vocab.decode(ids), text
