"""The SentencePiece unigram vocabulary as the rest of tibnlp uses it.

Syllable boundaries (`vocab.split_on_tsheg`, default true): the model is trained with a
normalisation rule, compiled into spm.model, that turns every tsheg into whitespace (and puts
a space after each shad). SentencePiece never lets a piece span whitespace, so every piece
lies inside one syllable, and every syllable starts with a `▁X` piece. Because the rule lives
in the model, encoding at use time (ours, or sentencepiece called directly) sees exactly what
training saw. `decode` maps the whitespace after a syllable back to a tsheg.

Why this and not SentencePiece's `pretokenization_delimiter` (syllable + tsheg as pre-tokens):
measured on the real corpus, the unigram model then keeps the tsheg as a piece of its own
(a stem `X` serves both `X་` and `X།`): 2.01 pieces per held-out syllable at 2000 pieces, where
this rule gives 1.07 at 16000 (benchmarks/results/vocab.md). A consequence: pieces are bounded
by the corpus's syllable inventory (19,010 syllable types in the real train split), so the
corpus supports only ~20k pieces in this mode. With `split_on_tsheg: false` the normaliser is
identity and pieces may span syllables (`པ་ལ`), at the cost of masking units that cut words.

Build (training and the report) lives in `tibnlp.text.vocab_build`.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sentencepiece as spm

from tibnlp.errors import DataError
from tibnlp.text.normalize import normalize
from tibnlp.text.sentences import SHADS
from tibnlp.text.special import CLS_ID, MASK_ID, PAD_ID, SEP_ID, SPECIAL_PIECES, UNK_ID
from tibnlp.text.syllables import SYLLABLE_RE, TSHEG

MARKER = "tibnlp-vocab.json"
MODEL_FILE = "spm.model"
# Every file `tibnlp vocab build` writes. A model or classifier directory carries these beside
# its weights, so a directory can be both; copying names them rather than taking a folder whole.
VOCAB_FILES = (MARKER, MODEL_FILE, "spm.vocab", "vocab.yaml", "report.json")
WORD_START = "\u2581"  # SentencePiece's whitespace marker
# Syllable characters: the same class as `tibnlp.text.syllables` (its regex without `[]+`).
_SYLLABLE_CHARS = frozenset(
    chr(c) for c in range(0x0F00, 0x1000) if SYLLABLE_RE.fullmatch(chr(c)) is not None
)

_SPACE_AFTER_SYLLABLE = re.compile(f"(?<={SYLLABLE_RE.pattern[:-1]}) (?=[^ A-Za-z0-9])")

# vocab.punctuation_pieces: the space its rule put before a closing shad (normalised text has
# none, but a tsheg after ང, which the rule made a space too)
_SPACE_BEFORE_SHAD = re.compile(f"(?<={SYLLABLE_RE.pattern[:-1]})(?<!ང) (?=[{SHADS}])")


def space_after_syllable(unk_surface: str) -> str:
    """The pattern of the space after a syllable that `decode` reads as a tsheg, less the space
    the unknown piece's surface opens with (SentencePiece's " ⁇ "): that space is part of the
    surface, not a syllable boundary. Python's `re` and Oniguruma (the export) read it alike."""
    rest = unk_surface[1:] if unk_surface.startswith(" ") else ""
    return _SPACE_AFTER_SYLLABLE.pattern + (f"(?!{re.escape(rest)})" if rest else "")


def is_syllable_char(char: str) -> bool:
    return char in _SYLLABLE_CHARS


def _require_folder(path: Path) -> None:
    """A vocabulary is a folder (spm.model and its marker): say so of a file or a typo."""
    if path.is_file():
        raise DataError(
            f"{path} is a file, not a vocabulary folder",
            "pass the folder `tibnlp vocab build --output` wrote (it holds "
            f"{MODEL_FILE} and {MARKER}), or a model folder that carries one",
        )
    if not path.exists():
        raise DataError(f"vocabulary folder {path} does not exist", "check the path")


def _processor(model_proto: bytes, path: Path | None) -> spm.SentencePieceProcessor:
    """The SentencePiece model; a damaged file (cut short, overwritten) is a DataError
    naming it rather than sentencepiece's internal parse error."""
    try:
        return spm.SentencePieceProcessor(model_proto=model_proto)
    except RuntimeError as exc:
        where = path / MODEL_FILE if path is not None else "(in memory)"
        raise DataError(
            f"{where}: not a readable SentencePiece model ({len(model_proto)} bytes; it may "
            "be cut short or overwritten)",
            "copy it again from its source, or rebuild the vocabulary with `tibnlp vocab build`",
        ) from exc


class Vocabulary:
    """A trained SentencePiece model plus the special-token ids tibnlp relies on."""

    def __init__(self, model_proto: bytes, path: Path | None = None) -> None:
        self.path = path
        self._proto = model_proto
        self.sp = _processor(model_proto, path)
        self.size: int = self.sp.get_piece_size()
        self.pad_id, self.unk_id, self.cls_id = PAD_ID, UNK_ID, CLS_ID
        self.sep_id, self.mask_id = SEP_ID, MASK_ID
        expected = list(SPECIAL_PIECES)
        got = [self.sp.id_to_piece(i) for i in range(len(expected))]
        if got != expected:
            raise DataError(
                f"vocabulary {path or '(in memory)'}: ids 0-4 are {got}, expected {expected}",
                "rebuild it with `tibnlp vocab build`",
            )
        # Never masked nor predicted: [PAD] and the control symbols. [UNK] stands for text
        # (an unseen character), so it is an ordinary piece inside its syllable.
        self.special_ids: frozenset[int] = frozenset(
            i for i in range(self.size) if self.sp.is_control(i) or i == self.pad_id
        )
        self.sha256: str = hashlib.sha256(model_proto).hexdigest()
        # Trained with the tsheg-as-whitespace rule (split_on_tsheg)? Read it off the model.
        self.split_on_tsheg: bool = TSHEG not in self.sp.normalize(f"ཀ{TSHEG}ཀ")
        self.punctuation_pieces: bool = f"{WORD_START}།" in self.sp.normalize("ཀ།")
        # what SentencePiece decodes the unknown piece to (" ⁇ "), kept as it is by `decode`
        self.unk_surface: str = str(self.sp.decode([self.unk_id]))
        self._space_after_syllable = re.compile(space_after_syllable(self.unk_surface))
        # Per piece: does it end inside a syllable (the next piece may continue it), and is
        # it a lone whitespace marker (which belongs to the syllable after it)?
        pieces = [self.sp.id_to_piece(i) for i in range(self.size)]
        self._ends_in_syllable = [
            i == self.unk_id or (i not in self.special_ids and bool(p) and is_syllable_char(p[-1]))
            for i, p in enumerate(pieces)
        ]
        self._lone_space = [p == WORD_START for p in pieces]
        self._opens_word = [p.startswith(WORD_START) for p in pieces]

    def text_ids(self, ids: Sequence[int]) -> list[int]:
        """The ids of encoded text that stand for text: control symbols and lone word-start
        markers left out ([] for a text of nothing, or of punctuation the form drops)."""
        return [i for i in ids if i not in self.special_ids and not self._lone_space[i]]

    def knows_none(self, ids: Sequence[int]) -> bool:
        """Whether encoded text holds [UNK] and nothing else the vocabulary knows: text of
        another script."""
        rest = self.text_ids(ids)
        return bool(rest) and all(i == self.unk_id for i in rest)

    @classmethod
    def load(cls, path: Path | str) -> Vocabulary:
        path = Path(path)
        _require_folder(path)
        marker = path / MARKER
        missing = [f.name for f in (marker, path / MODEL_FILE) if not f.is_file()]
        if missing:
            # a model or classifier folder (its config beside the weights) lost these files
            # in a partial copy: rebuilding a vocabulary would not give its ids back
            holder = any((path / name).is_file() for name in ("model.yaml", "classifier.yaml"))
            raise DataError(
                f"{path} is not a tibnlp vocabulary (no {' and no '.join(missing)})",
                f"this model folder lost its vocabulary files: copy the folder whole from where "
                f"it was written (its {', '.join(VOCAB_FILES[:4])} travel with the weights)"
                if holder
                else "build one with `tibnlp vocab build --corpus DIR --output DIR`",
            )
        try:
            kind = json.loads(marker.read_text(encoding="utf-8")).get("kind")
        except (ValueError, AttributeError) as exc:
            raise DataError(f"{marker}: not valid JSON ({exc})", "rebuild the vocabulary") from exc
        if kind != "vocabulary":
            raise DataError(f"{marker}: kind is {kind!r}, expected 'vocabulary'")
        return cls((path / MODEL_FILE).read_bytes(), path)

    # Pickled for `datasets.map(num_proc=...)`: the model travels as bytes.
    def __getstate__(self) -> dict[str, Any]:
        return {"proto": self._proto, "path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["proto"], state["path"])  # type: ignore[misc]

    def encode(self, text: str) -> list[int]:
        return list(self.sp.encode(normalize(text)))

    def sample(self, texts: Sequence[str], alpha: float, nbest: int, seed: int) -> list[list[int]]:
        """One segmentation of each text drawn from the unigram model (subword regularization,
        Kudo 2018): P(segmentation) ~ P_LM^alpha over the `nbest` best (-1: all of them).
        SentencePiece draws from one process-wide generator; seeding it here makes the draw a
        function of `seed` alone, so a resumed or repeated run reads the same pieces."""
        spm.set_random_generator_seed(seed % 2**32)
        return [
            list(self.sp.encode(normalize(t), enable_sampling=True, alpha=alpha, nbest_size=nbest))
            for t in texts
        ]

    def encode_batch(self, texts: Sequence[str], num_threads: int = -1) -> list[list[int]]:
        """Many texts at once: SentencePiece's C++ batch encoder on `num_threads` threads
        (-1: all cores), which avoids a Python round trip per text."""
        return self.sp.encode([normalize(t) for t in texts], num_threads=num_threads)

    def decode(self, ids: Sequence[int]) -> str:
        """Readable text of `ids` (for display; nothing in training or prediction reads it).

        With `split_on_tsheg` a tsheg and a space encode to the same ids, so which one stood
        after a syllable is a guess: a tsheg, unless ASCII letters or digits follow (in a
        sample of the corpora tsheg outnumbers space ~3:1 before other non-Tibetan text, and
        space ~5:1 before ASCII). The unknown piece reads as SentencePiece's surface (" ⁇ ") where
        SentencePiece puts it; control ids ([CLS] [SEP] [MASK] [PAD]) read as nothing, as there.
        """
        text = str(self.sp.decode(list(ids)))
        if self.punctuation_pieces:
            text = _SPACE_BEFORE_SHAD.sub("", text)
        if self.split_on_tsheg:  # whitespace after a syllable was a tsheg
            text = self._space_after_syllable.sub(TSHEG, text)
        return text

    def piece_log_probs(self) -> list[float]:
        """Each piece's log probability under the unigram model (its SentencePiece score);
        0 for pieces the EM never scored (control and user-defined symbols)."""
        return [float(self.sp.get_score(i)) for i in range(self.size)]

    def id_to_piece(self, i: int) -> str:
        return str(self.sp.id_to_piece(int(i)))

    def piece_to_id(self, piece: str) -> int:
        return int(self.sp.piece_to_id(piece))

    def syllable_starts(self, ids: Sequence[int]) -> list[bool]:
        """True where a piece opens a new syllable unit (for whole-syllable masking).

        A piece continues the current unit when the piece before it ended on a syllable
        letter (so this piece carries more of that syllable, or the tsheg/shad closing it) or
        was a lone `▁` (a space belongs to the syllable after it), unless it starts with `▁`.
        Special tokens are units of their own. With `split_on_tsheg: false` a piece that
        spans syllables is one unit.
        """
        out: list[bool] = []
        prev = -1
        ends, lone, specials = self._ends_in_syllable, self._lone_space, self.special_ids
        opens = self._opens_word
        for i in ids:
            i = int(i)
            if prev < 0 or i in specials or prev in specials:
                out.append(True)
            else:
                out.append(opens[i] or not (ends[prev] or lone[prev]))
            prev = i
        return out


def copy_vocabulary(source: Path | str, target: Path | str) -> None:
    """The vocabulary files of `source` (a vocabulary, model or classifier directory) into
    `target`, and nothing else: weights and configs beside them stay behind."""
    for name in VOCAB_FILES:
        if (Path(source) / name).is_file():
            shutil.copy2(Path(source) / name, Path(target) / name)
