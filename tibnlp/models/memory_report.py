"""`tibnlp model memory`: which tokens of a text GEMFormer's selection keeps, and why.

Reads a pretraining model directory (`model.safetensors` with the MLM head, `model.yaml`,
`spm.model`), tokenizes the text as pretraining did (the vocabulary's fixed special ids,
[CLS] first) and runs `select_memory`.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm
import torch

from tibnlp.config.finetune import GlobalMemoryConfig
from tibnlp.errors import DataError
from tibnlp.models.io import WEIGHTS, load_pretrained
from tibnlp.models.long_documents.gemformer import keep_low_entropy, token_entropy
from tibnlp.models.pretraining import AlbertForPretraining
from tibnlp.text.special import CLS_ID, SPECIAL_PIECES

SPM_FILE = "spm.model"


@dataclass
class KeptToken:
    position: int  # in the tokenized document ([CLS] = 0)
    piece: str
    entropy: float


@dataclass
class MemoryReport:
    """Selection of one document: `kept` in document order, and the figures to log."""

    tokens: int  # content tokens of the document
    kept: list[KeptToken]
    threshold: float
    budget: int
    segment_len: int
    mean_entropy: float
    memory_text: str  # the kept pieces decoded in order

    @property
    def share(self) -> float:
        return len(self.kept) / max(self.tokens, 1)


def load_mlm(model_dir: Path) -> tuple[AlbertForPretraining, spm.SentencePieceProcessor]:
    """The pretraining model (MLM head included) and its SentencePiece model."""
    model_dir = Path(model_dir)
    cfg, state = load_pretrained(model_dir)
    # the pair head exists only where pretraining ran SOP (the main job's recipe has none);
    # the same-document contrast's projection is a pretraining-only head, not read here
    sop = any(k.startswith("sop_") for k in state)
    state = {k: v for k, v in state.items() if not k.startswith("contrastive_proj.")}
    model = AlbertForPretraining(cfg, sop=sop)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise DataError(
            f"{model_dir / WEIGHTS} is not an MLM pretraining model (no MLM head): missing "
            f"{sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}",
            "point --model at the directory written by pretraining, not a fine-tuned encoder",
        )
    path = model_dir / SPM_FILE
    if not path.is_file():
        raise DataError(f"{path} does not exist", "copy the vocabulary's spm.model beside it")
    sp = spm.SentencePieceProcessor(model_file=str(path))
    got = [sp.id_to_piece(i) for i in range(min(5, sp.get_piece_size()))]
    if got != list(SPECIAL_PIECES):
        raise DataError(f"{path}: ids 0-4 are {got}, expected {SPECIAL_PIECES}")
    if sp.get_piece_size() != cfg.vocab_size:
        raise DataError(
            f"{path} has {sp.get_piece_size()} pieces but {model_dir / 'model.yaml'} says "
            f"vocab_size {cfg.vocab_size}",
            "the model directory mixes files of two different runs",
        )
    return model.eval(), sp


def read_text(path: Path) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise DataError(f"{path} does not exist") from exc
    except UnicodeDecodeError as exc:
        raise DataError(f"{path} is not UTF-8 text ({exc})") from exc
    lines = [unicodedata.normalize("NFC", ln).strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln]
    if not lines:
        raise DataError(f"{path} holds no text")
    return "\n".join(lines)


def inspect_memory(
    model_dir: Path,
    text_path: Path,
    threshold: float | None = None,
    budget: int | None = None,
    segment_len: int | None = None,
) -> MemoryReport:
    """Run GEMFormer's first pass over one document (the pretrained MLM's selection, as
    `finetune.memory_selection=frozen` makes it); defaults of `finetune.global_memory`."""
    model, sp = load_mlm(model_dir)
    gm = GlobalMemoryConfig()
    threshold = gm.threshold if threshold is None else threshold
    budget = gm.budget if budget is None else budget
    segment_len = segment_len or model.cfg.max_len
    ids = [CLS_ID]
    for line in read_text(text_path).split("\n"):
        ids.extend(sp.encode(line))
    input_ids = torch.tensor([ids])
    mask = torch.ones_like(input_ids)
    entropy = token_entropy(model, input_ids, mask, segment_len)
    memory = keep_low_entropy(input_ids, entropy, threshold, budget)
    pos = memory.positions[0, memory.mask[0]].tolist()
    # an entropy is >= 0; rounding leaves -1e-7 on a certain token, shown as "-0.000"
    kept = [KeptToken(p, sp.id_to_piece(ids[p]), max(0.0, float(entropy[0, p]))) for p in pos]
    finite = entropy[torch.isfinite(entropy)]
    return MemoryReport(
        tokens=len(ids) - 1,
        kept=kept,
        threshold=threshold,
        budget=budget,
        segment_len=segment_len,
        mean_entropy=max(0.0, float(finite.mean())) if finite.numel() else float("nan"),
        memory_text=decode_kept(sp, [ids[p] for p in pos]),
    )


def decode_kept(sp: spm.SentencePieceProcessor, ids: list[int]) -> str:
    """The kept pieces as text, an unknown piece written as the table shows it ([UNK]):
    SentencePiece decodes it as " ⁇ ", which reads like a character of the document, while
    the model kept the unknown token, not the characters it replaced."""
    unk = sp.unk_id()
    pieces = [_UNK_MARK if i == unk else sp.id_to_piece(i) for i in ids]
    return str(sp.decode_pieces(pieces)).replace(_UNK_MARK, sp.id_to_piece(unk))


_UNK_MARK = "\U000f0000"  # a private-use character: no vocabulary has it as a piece
