"""`Vocabulary.decode` of ids holding the unknown piece: the piece reads as SentencePiece's unk
surface (" ⁇ "), where SentencePiece puts it, with no tsheg put before it (the rule that turns
the space after a syllable back into a tsheg took the surface's own space for one)."""

from __future__ import annotations

import itertools
import re

import pytest

from tests.ft_fixtures import make_vocab
from tibnlp.text.syllables import TSHEG
from tibnlp.text.vocab import Vocabulary


@pytest.fixture(scope="module")
def vocab(tmp_path_factory: pytest.TempPathFactory) -> Vocabulary:
    return Vocabulary.load(make_vocab(tmp_path_factory.mktemp("decode_unk") / "vocab"))


def test_unknown_piece_after_a_syllable_has_no_tsheg_before_it(vocab: Vocabulary) -> None:
    rgyal, khab = vocab.piece_to_id("▁རྒྱལ"), vocab.piece_to_id("▁ཁབ")
    unk = vocab.unk_id
    assert vocab.sp.decode([unk]) == " ⁇ "  # SentencePiece's unk surface
    assert vocab.decode([rgyal, unk, khab]) == "རྒྱལ ⁇  ཁབ"
    assert vocab.decode([rgyal, khab, unk]) == "རྒྱལ་ཁབ ⁇ "
    assert vocab.decode([vocab.cls_id, rgyal, unk, vocab.sep_id]) == "རྒྱལ ⁇ "


def _surfaces(text: str, surface: str) -> list[int]:
    return [m.start() for m in re.finditer(re.escape(surface), text)]


def test_decode_is_sentencepiece_text_for_any_ids_with_the_unknown_piece(
    vocab: Vocabulary,
) -> None:
    """Every short sequence of syllable pieces, a continuation piece, a lone `▁`, [UNK] and the
    control ids: SentencePiece's text with tshegs for the spaces after syllables, and the unk
    surface at each place SentencePiece puts it."""
    pieces = ["▁རྒྱལ", "▁ཁབ", "▁", "ཁ"]
    ids = [vocab.piece_to_id(p) for p in pieces]
    ids += [vocab.unk_id, vocab.cls_id, vocab.sep_id, vocab.mask_id, vocab.pad_id]
    surface = str(vocab.sp.decode([vocab.unk_id]))
    for length in (1, 2, 3):
        for seq in itertools.product(ids, repeat=length):
            if vocab.unk_id not in seq:
                continue
            ours, theirs = vocab.decode(seq), str(vocab.sp.decode(list(seq)))
            assert ours.replace(TSHEG, " ") == theirs, seq
            assert _surfaces(ours, surface) == _surfaces(theirs, surface), seq
