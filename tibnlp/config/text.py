"""Settings of the text stages: corpus preparation and the SentencePiece vocabulary."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tibnlp.config.core import check, check_seed
from tibnlp.text.special import SPECIAL_PIECES


@dataclass
class CorpusConfig:
    """`tibnlp corpus prepare`: how raw text becomes the prepared corpus."""

    field: str = "text"  # JSONL field holding the text
    min_tibetan_ratio: float = 0.5  # share of Tibetan-block chars among non-space chars of a line
    min_syllables: int = 2
    dedup: bool = True  # exact dedup of sentences across the corpus (first occurrence kept)
    # Shorter sentences are never dropped as duplicates: short formulae ("དེས་སྨྲས་པ།") recur in
    # many documents and dropping them would cut documents apart (see text/filtering.py).
    dedup_min_syllables: int = 8
    heldout_fraction: float = 0.01  # documents held out for pretraining evaluation
    join_spaced_syllables: bool = False  # "ཀ ཁ" (TNCC form) -> "ཀ་ཁ"
    split_on_ga_space: bool = True  # "...འདུག རྒྱ..." (no shad after ག/ཀ) ends a sentence
    on_error: Literal["fail", "skip"] = "fail"
    num_proc: int = 0  # 0: one per CPU core
    seed: int = 42
    # also find the botok words of every sentence (OUT/words/, as `tibnlp corpus words`), which
    # whole-word masking (pretrain.masking: whole_word) needs; offline, from the dialect pack
    # in the data directory (botok/general)
    words: bool = False

    def validate(self, prefix: str) -> None:
        check(
            0.0 <= self.min_tibetan_ratio <= 1.0, f"{prefix}.min_tibetan_ratio", "must be in [0, 1]"
        )
        check(self.min_syllables >= 0, f"{prefix}.min_syllables", "must be >= 0")
        check(self.dedup_min_syllables >= 0, f"{prefix}.dedup_min_syllables", "must be >= 0")
        check(bool(self.field), f"{prefix}.field", "must name the JSONL text field")
        check(0.0 <= self.heldout_fraction < 1.0, f"{prefix}.heldout_fraction", "must be in [0, 1)")
        check(self.num_proc >= 0, f"{prefix}.num_proc", "must be >= 0 (0 = all cores)")
        check_seed(self.seed, f"{prefix}.seed")


@dataclass
class VocabConfig:
    """`tibnlp vocab build`: the SentencePiece unigram model."""

    vocab_size: int = 30000
    character_coverage: float = 0.9995
    split_on_tsheg: bool = True  # pieces never cross a syllable boundary
    # Tibetan punctuation (the shad forms, the head marks ༄ ༅ and their kin: `PUNCTUATION` in
    # tibnlp/text/spm_units.py) as units of their own (`▁།`), always in the vocabulary.
    # Otherwise a closing shad is glued onto the syllable before it (`▁རེད།`), so a
    # sentence-final syllable learns an embedding apart from its mid-sentence twin, and marks
    # the corpus rarely holds (the head marks some TNCC titles open with) encode as [UNK].
    # Take it with whole_units: without them SentencePiece's own seeds lose the syllables that
    # only the glued forms made candidates (one piece for 85 % of the main job's syllable
    # tokens instead of 96 %).
    punctuation_pieces: bool = False
    # Seed SentencePiece with every whitespace unit it trains on (a syllable under
    # split_on_tsheg, with its closing shad where one follows) seen at least twice, and their
    # substrings. SentencePiece's own seeds are the branching repeats its suffix array finds in
    # the sentences (substrings followed by more than one character), and a syllable is almost
    # always followed by the next one's ▁, so one that no longer syllable extends and no shad
    # follows is never a candidate: in the main job's 14k vocabulary 3.8 % of held-out
    # syllable tokens split, common ones among them (གོང as ▁གོ + ང, འཛམ as ▁འཛ + མ).
    # Measured in benchmarks/results/vocab.md.
    whole_units: bool = False
    # Under split_on_tsheg, let a piece span syllables (`▁རྒྱ▁ནག`, "China": SentencePiece's
    # split_by_whitespace off, the tsheg still whitespace): frequent words and phrases become
    # one piece, and a text takes fewer pieces. A piece may also start inside a syllable
    # (`འི▁ནང`); masking units then join it to the piece before (Vocabulary.syllable_starts).
    # A lever for how much pretraining pays (benchmarks/results/vocab_units.md).
    cross_syllables: bool = False
    # Under the syllable rule the corpus's syllable inventory bounds the size (about 20k pieces
    # for the shared corpora), so by default vocab_size is a ceiling: the largest vocabulary
    # the corpus supports is built and the report says so. true: fail instead.
    hard_limit: bool = False
    input_sentence_size: int = 2_000_000  # sentences sampled (shuffled) for training
    max_sentence_length: int = 8192  # bytes; longer sentences are skipped by SentencePiece
    # SentencePiece's threads change the trained scores (the same pieces, in another order:
    # 1,622 of 19,558 moved between 2 and 16 threads on the nine corpora), so the default is
    # fixed rather than one per core: a vocabulary is the same on any machine. 2 is what the
    # 2-core CPU runs (the main job's included) built with. 0: one per core (faster, per machine).
    num_threads: int = 2
    special_tokens: list[str] = field(default_factory=lambda: list(SPECIAL_PIECES))
    seed: int = 42

    def validate(self, prefix: str) -> None:
        check(self.vocab_size >= 16, f"{prefix}.vocab_size", "must be >= 16")
        check(  # (SentencePiece refuses less than 0.98)
            0.98 <= self.character_coverage <= 1.0,
            f"{prefix}.character_coverage",
            "must be in [0.98, 1]",
        )
        if self.cross_syllables:
            check(
                self.split_on_tsheg,
                f"{prefix}.cross_syllables",
                "needs split_on_tsheg: true (without the syllable rule pieces cross anyway)",
            )
            check(
                not self.whole_units,
                f"{prefix}.cross_syllables",
                "does not combine with whole_units (its seeds are single syllables); drop one",
            )
        # SentencePiece also takes 0 (all of the corpus), which this check has always refused;
        # 1..100 failed SentencePiece's own check, naming no key
        check(
            self.input_sentence_size > 100,
            f"{prefix}.input_sentence_size",
            f"{self.input_sentence_size} sentences: SentencePiece samples more than 100 (give "
            "e.g. 2000000, the default; a smaller corpus is read whole)",
        )
        check(self.num_threads >= 0, f"{prefix}.num_threads", "must be >= 0 (0: one per core)")
        check_seed(self.seed, f"{prefix}.seed")
        # SentencePiece parses these as 32-bit ints (a larger one: a traceback) or refuses them
        # with its own check, naming no key
        for key, low, high in (
            ("vocab_size", 16, (2**31 - 1) // 10),  # x 10: its seed_sentencepiece_size
            ("max_sentence_length", 10, 2**30),
            ("input_sentence_size", 101, 2**63 - 1),
            ("num_threads", 0, 1024),
        ):
            value = getattr(self, key)
            check(
                low <= value <= high,
                f"{prefix}.{key}",
                f"{value} is outside what SentencePiece takes ({low} to {high:,})",
            )
        check(
            tuple(self.special_tokens[:5]) == SPECIAL_PIECES,
            f"{prefix}.special_tokens",
            "must start with [PAD], [UNK], [CLS], [SEP], [MASK] (fixed ids 0-4)",
        )
        check(
            len(set(self.special_tokens)) == len(self.special_tokens),
            f"{prefix}.special_tokens",
            "must be distinct (a piece given twice gets one id)",
        )
        for piece in self.special_tokens[5:]:
            # SentencePiece cuts a user symbol out of the text wherever it occurs: an empty one
            # was dropped, "▁" took every word-start mark (the syllable and word units masking
            # relies on), and a Tibetan character was no longer read as text (more [UNK])
            check(
                bool(piece)
                and not any(
                    c.isspace() or c == "\u2581" or "\u0f00" <= c <= "\u0fff" for c in piece
                ),
                f"{prefix}.special_tokens",
                f"{piece!r}: an extra special piece must be non-empty, without spaces, '\u2581' "
                "or Tibetan characters (e.g. [NUM])",
            )
