"""STAND-IN until the `vocabdata` branch lands (its module replaces this one at merge).

A SentencePiece model `spm.model` in a directory, ids 0-4 = [PAD] [UNK] [CLS] [SEP] [MASK].
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import sentencepiece as spm

from tibnlp.errors import DataError
from tibnlp.text.normalize import normalize


class Vocabulary:
    pad_id = 0
    unk_id = 1
    cls_id = 2
    sep_id = 3
    mask_id = 4

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.sp = spm.SentencePieceProcessor(model_file=str(self.path / "spm.model"))
        self.sha256 = hashlib.sha256((self.path / "spm.model").read_bytes()).hexdigest()

    @classmethod
    def load(cls, directory: Path) -> Vocabulary:
        if not (Path(directory) / "spm.model").is_file():
            raise DataError(f"{directory}: no spm.model here", "give a vocabulary directory")
        return cls(Path(directory))

    @property
    def size(self) -> int:
        return int(self.sp.get_piece_size())

    def encode(self, text: str) -> list[int]:
        return list(self.sp.encode(normalize(text)))
