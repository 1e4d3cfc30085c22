"""botok words aligned to vocabulary pieces: the boundary levels whole-word masking needs.

The words of a prepared corpus are found once, at preparation time (`tibnlp corpus words`,
`tibnlp.text.corpus_words`), and stored as byte offsets per sentence. Here they meet a
vocabulary: each piece gets a level, INSIDE (continues a unit), SYLLABLE (opens a syllable
unit, `Vocabulary.syllable_starts`) or WORD (opens a syllable unit that opens a botok word).

A syllable unit belongs to the botok token holding its first character that is not a space or
tsheg (a piece carries the separator before its syllable as `▁`), nor a shad: the vocabulary's
rule writes a space after each shad, and SentencePiece gives the shad's bytes to the piece after
that space, so "། རྒྱལ" is the surface of the piece `▁རྒྱལ`. Units are grouped into
words, never cut: where botok cuts inside a unit (a digit glued to a syllable, or a piece of a
vocabulary whose pieces cross syllables) the unit stays whole and the words it touches become
one group, so a group is always a run of whole syllable units and whole words, and masking one
never splits either.
"""

from __future__ import annotations

import bisect
import itertools

from tibnlp.text.normalize import normalize
from tibnlp.text.sentences import SHADS
from tibnlp.text.syllables import NBSP_TSHEG, TSHEG
from tibnlp.text.vocab import Vocabulary

# Per-piece boundary levels: inside a unit, opens a syllable unit, opens a word (and a unit).
INSIDE, SYLLABLE, WORD = 0, 1, 2
# in the cache key of whole-word pretraining data; 2: units after a shad inside a sentence;
# 3: words a unit reaches into join its word
LEVELS_VERSION = 3
# what a piece's surface may start with before its own syllable: the separator it carries as
# `▁`, and the shads the vocabulary's rule follows with a space (`spm_units.SYLLABLE_RULES`)
_SEPARATORS = f" \t{TSHEG}{NBSP_TSHEG}{SHADS}"


def piece_levels(
    vocab: Vocabulary, text: str, word_starts: list[int]
) -> tuple[list[int], list[int]]:
    """(ids, levels) of one sentence: the pieces `vocab.encode` gives, each with INSIDE,
    SYLLABLE or WORD (see the module docstring), from the byte offsets `WordSegmenter.starts`
    gave for the same normalised text. The first unit always opens a word."""
    proto = vocab.sp.encode(normalize(text), return_type="proto")
    pieces = list(proto.pieces)
    ids = [int(p.id) for p in pieces]
    levels = [int(s) for s in vocab.syllable_starts(ids)]
    heads = [i for i, level in enumerate(levels) if level] + [len(ids)]
    reached = -1  # the last botok word any earlier unit's bytes reach into
    for head, end in itertools.pairwise(heads):
        anchor = pieces[head].begin
        for piece in pieces[head:end]:
            surface = piece.surface
            kept = surface.lstrip(_SEPARATORS)
            if kept:
                anchor = piece.begin + len(surface[: len(surface) - len(kept)].encode())
                break
        word = bisect.bisect_right(word_starts, anchor) - 1
        if word > reached:
            levels[head] = WORD
        # a unit reaching into the next word (a piece across syllables, `vocab.cross_syllables`,
        # or a digit botok cuts off) joins that word to its own: one masking group
        last = max(anchor, pieces[end - 1].end - 1)
        reached = max(reached, word, bisect.bisect_right(word_starts, last) - 1)
    return ids, levels


def boundary_columns(levels: list, words: bool) -> dict[str, list[bool]]:
    """The stored boundary columns of one example from its per-piece levels (or bools):
    `syllable_start`, and `word_start` when the example has word levels."""
    out = {"syllable_start": [bool(x) for x in levels]}
    if words:
        out["word_start"] = [x == WORD for x in levels]
    return out
