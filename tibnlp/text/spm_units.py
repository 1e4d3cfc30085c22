"""The units SentencePiece trains on: the normalisation rules compiled into spm.model (tsheg
and shads as whitespace, punctuation as pieces of its own) and, for `vocab.whole_units`, the
seed pieces drawn from those units. Apart from the training itself (`vocab_build`): they
decide what a piece can be, and code that must split text as the vocabulary does reads them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from tibnlp.config.text import VocabConfig
from tibnlp.text.sentences import SHADS
from tibnlp.text.vocab import WORD_START

# SentencePiece normalisation rules (hex code points -> hex code points) for split_on_tsheg:
# tsheg becomes whitespace, so each syllable is a SentencePiece "word" `▁X` (its own pieces
# can never reach into the next syllable); a space after each shad keeps punctuation from
# gluing to the following syllable. The rules are compiled into spm.model itself, so
# sentencepiece used directly encodes exactly like `Vocabulary.encode`.
SYLLABLE_RULES = {
    "F0B": "20",  # tsheg
    "F0C": "20",  # non-breaking tsheg
    **{f"{ord(c):X}": f"{ord(c):X} 20" for c in SHADS},
}
# vocab.punctuation_pieces: head marks, shads and the other section marks, each a unit of its
# own (whitespace on both sides: `▁།`) and in the vocabulary whatever the corpus (required
# characters). Not SentencePiece's user-defined symbols: the normalisation rules skip those,
# so a syllable right after one would lose its `▁`.
HEAD_MARKS = "".join(chr(c) for c in range(0x0F04, 0x0F0B))  # ༄ ༅ and their kin
PUNCTUATION = tuple(HEAD_MARKS + SHADS)


def normalization_rules(config: VocabConfig) -> dict[str, str]:
    """SentencePiece's rules (hex code points -> hex code points) for this config; empty:
    identity."""
    rules = dict(SYLLABLE_RULES) if config.split_on_tsheg else {}
    if config.punctuation_pieces:
        rules.update({f"{ord(c):X}": f"20 {ord(c):X} 20" for c in PUNCTUATION})
    return rules


def unit_breaks(config: VocabConfig) -> dict[int, str]:
    """The same rules as a str.translate table: the units SentencePiece trains on are the
    whitespace-separated parts of `text.translate(unit_breaks(config))`."""
    return {
        int(key, 16): "".join(chr(int(code, 16)) for code in value.split())
        for key, value in normalization_rules(config).items()
    }


def unit_seeds(config: VocabConfig, sentences: Iterable[str], path: Path) -> int:
    """vocab.whole_units: the seed file SentencePiece starts from (`piece<TAB>frequency`):
    every whitespace unit of the normalised text (`▁` + the unit) seen at least twice, and
    every substring of those units of two characters or more (SentencePiece adds the single
    characters) and at most `max_piece_length()` (SentencePiece drops longer seeds, and a
    repeated unit without whitespace, a long URL, would give quadratically many), by corpus
    frequency; the `seed_sentencepiece_size` best by frequency x length, as SentencePiece ranks
    its own. Returns the number of seeds."""
    longest = max_piece_length()
    units: Counter[str] = Counter()
    table = unit_breaks(config)
    for sentence in sentences:
        units.update(sentence.translate(table).split())
    found: Counter[str] = Counter()
    for unit, count in units.items():
        if count < 2:
            continue
        word = WORD_START + unit
        for i in range(len(word)):
            for j in range(i + 2, min(i + longest, len(word)) + 1):
                found[word[i:j]] += count
    ranked = sorted(
        ((p, c) for p, c in found.items() if p != WORD_START and p not in config.special_tokens),
        key=lambda pc: (-pc[1] * len(pc[0]), pc[0]),
    )[: seed_size(config)]
    path.write_text("".join(f"{p}\t{c}\n" for p, c in ranked), encoding="utf-8")
    return len(ranked)


def max_piece_length() -> int:
    """SentencePiece's max_sentencepiece_length (its default: `vocab_build` leaves it)."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    return int(pb.TrainerSpec().max_sentencepiece_length)  # type: ignore[attr-defined]


def seed_size(config: VocabConfig) -> int:
    return max(1_000_000, config.vocab_size * 10)
