"""Word levels of pieces after a shad inside a sentence (`tibnlp.data.words.piece_levels`).

The vocabulary's rule writes a space after each shad, and SentencePiece reports the shad's bytes
as the start of the next piece's surface ("། རྒྱལ" for `▁རྒྱལ`). That piece must still belong to
the botok word of its syllable, or the word after every inner shad is cut in two."""

from __future__ import annotations

from tests.ft_fixtures import make_vocab
from tibnlp.data.words import INSIDE, SYLLABLE, WORD, piece_levels
from tibnlp.text.vocab import Vocabulary


def test_a_word_after_an_inner_shad_stays_whole(tmp_path) -> None:
    vocab = Vocabulary.load(make_vocab(tmp_path / "vocab"))
    words = ["བོད་", "ཀྱི", "། ", "རྒྱལ་ཁབ་", "དང"]  # botok's tokens; རྒྱལ་ཁབ is one word
    text = "".join(words)
    starts = [len("".join(words[:i]).encode()) for i in range(len(words))]
    ids, levels = piece_levels(vocab, text, starts)
    pieces = [vocab.id_to_piece(i) for i in ids]
    assert pieces[3:] == ["▁རྒྱལ", "▁ཁབ", "▁དང"]
    assert levels == [WORD, WORD, INSIDE, WORD, SYLLABLE, WORD]
