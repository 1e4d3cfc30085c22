"""GEMFormer's behaviour (Sagirova & Burtsev 2023): what the global memory changes, what the
second pass sees, and the layout of its rows, on a tiny encoder without recurrence (so a
segment sees earlier segments only through the memory)."""

from __future__ import annotations

import torch
from design_models import tiny

from tibnlp.models import AlbertForPretraining, Encoder
from tibnlp.models.long_documents.gemformer import (
    GlobalMemory,
    encode_with_memory,
    keep_low_entropy,
    token_entropy,
)
from tibnlp.models.long_documents.memory_reader import MemoryReader
from tibnlp.text.special import CLS_ID, SEP_ID

SEG = 5  # [CLS] + 4 content tokens per segment
# [CLS] then two segments of content: positions 1-4 read first, 5-8 second
DOC = torch.tensor([[CLS_ID, 10, 11, 12, 13, 20, 21, 22, 23]])
MASK = torch.ones_like(DOC)


def _encoder() -> Encoder:
    torch.manual_seed(0)
    return Encoder(tiny()).eval()


def _memory(doc: torch.Tensor, keep: list[int]) -> GlobalMemory:
    """The memory that keeps exactly the tokens at `keep` (entropy 0 there, 1 elsewhere)."""
    ent = torch.ones(doc.shape)
    ent[0, 0] = float("inf")
    ent[0, keep] = 0.0
    return keep_low_entropy(doc, ent, threshold=0.5, budget=16)


class Recorder:
    """Wraps an encoder and records the rows it is given (ids, mask, token types)."""

    def __init__(self, encoder: Encoder) -> None:
        self.encoder, self.calls = encoder, []
        self.cfg = encoder.cfg

    def __call__(self, ids, mask, types=None, memory=None):
        self.calls.append((ids.clone(), mask.clone(), None if types is None else types.clone()))
        return self.encoder(ids, mask, types, memory=memory)

    def __getattr__(self, name):
        return getattr(self.encoder, name)


def test_memory_content_changes_a_later_segments_output() -> None:
    enc = _encoder()
    with torch.no_grad():
        a = encode_with_memory(enc, DOC, MASK, _memory(DOC, [1, 2]), SEG)
        b = encode_with_memory(enc, DOC, MASK, _memory(DOC, [3, 4]), SEG)
        again = encode_with_memory(enc, DOC, MASK, _memory(DOC, [1, 2]), SEG)
    later = slice(5, 9)  # the second segment's tokens
    assert not torch.allclose(a.hidden[0, later], b.hidden[0, later], atol=1e-4)
    torch.testing.assert_close(a.hidden, again.hidden)  # the same memory: the same output
    assert not torch.allclose(a.sentence, b.sentence, atol=1e-4)


def test_a_token_the_memory_keeps_is_visible_in_the_second_pass() -> None:
    """Change a first-segment token: the second segment's states move when the memory keeps
    that token, and not when it keeps others (no recurrence: the memory is the only path)."""
    enc = _encoder()
    changed = DOC.clone()
    changed[0, 2] = 30  # position 2 sits in the first segment
    later = slice(5, 9)
    with torch.no_grad():
        kept = [encode_with_memory(enc, d, MASK, _memory(d, [2]), SEG) for d in (DOC, changed)]
        other = [encode_with_memory(enc, d, MASK, _memory(d, [3]), SEG) for d in (DOC, changed)]
    assert not torch.allclose(kept[0].hidden[0, later], kept[1].hidden[0, later], atol=1e-4)
    torch.testing.assert_close(other[0].hidden[0, later], other[1].hidden[0, later])


def test_rows_are_cls_prefix_sep_memory_sep_segment_with_token_types() -> None:
    enc = Recorder(_encoder())
    memory = _memory(DOC, [2, 4])  # tokens 11 and 13
    with torch.no_grad():
        encode_with_memory(enc, DOC, MASK, memory, SEG, prefixes=[[33, 34]])  # type: ignore[arg-type]
    assert len(enc.calls) == 2  # one call per segment
    head = [CLS_ID, 33, 34, SEP_ID, 11, 13, SEP_ID]
    for (ids, mask, types), body in zip(
        enc.calls, ([10, 11, 12, 13], [20, 21, 22, 23]), strict=True
    ):
        assert ids[0].tolist() == head + body
        assert mask[0].tolist() == [1] * (len(head) + len(body))
        assert types[0].tolist() == [0] * len(head) + [1] * len(body)


def test_the_prefix_enters_the_first_pass_too() -> None:
    """The first pass reads `[CLS] prefix [SEP] segment`: the title changes the entropies."""
    torch.manual_seed(0)
    mlm = AlbertForPretraining(tiny(), sparse_last_layer=False).eval()
    rec = Recorder(mlm.encoder)

    class LM:
        encoder = rec

        @staticmethod
        def mlm_logits(hidden):
            return mlm.mlm_logits(hidden)

    plain = token_entropy(LM(), DOC, MASK, SEG)  # type: ignore[arg-type]
    assert rec.calls[0][0][0].tolist() == [CLS_ID, 10, 11, 12, 13]
    assert rec.calls[0][2][0].tolist() == [0] * 5  # a lone segment: pretraining's types
    rec.calls.clear()
    titled = token_entropy(LM(), DOC, MASK, SEG, prefixes=[[33, 34]])  # type: ignore[arg-type]
    assert rec.calls[0][0][0].tolist() == [CLS_ID, 33, 34, SEP_ID, 10, 11, 12, 13]
    assert rec.calls[0][2][0].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert torch.isinf(titled[0, 0]) and torch.isfinite(titled[0, 1:]).all()
    assert not torch.allclose(plain[0, 1:], titled[0, 1:])


def test_the_reader_splits_a_prefixed_row_and_keeps_document_positions() -> None:
    """`prefix=True`: an input row `[CLS] title [SEP] document [SEP]` is read as the title
    in both passes and the document's tokens keep their places in the output."""
    torch.manual_seed(0)
    mlm = AlbertForPretraining(tiny(), sparse_last_layer=False)
    reader = MemoryReader(mlm.encoder, SEG, threshold=100.0, budget=2, prefix=True)
    reader.load_mlm(mlm)
    reader.eval()
    row = torch.tensor([[CLS_ID, 33, 34, SEP_ID, 10, 11, 12, 13, 20, SEP_ID]])
    with torch.no_grad():
        out = reader(row, torch.ones_like(row))
        doc = torch.tensor([[CLS_ID, 10, 11, 12, 13, 20, SEP_ID]])
        mem_titled = reader.memory([row[0].tolist()], torch.device("cpu"))
        want = encode_with_memory(
            mlm.encoder, doc, torch.ones_like(doc), mem_titled, SEG, [[33, 34]]
        )
    assert mem_titled.size.item() == 2
    assert out.hidden.shape == (1, 10, 32)
    torch.testing.assert_close(out.hidden[0, 4:10], want.hidden[0, 1:7])  # document tokens
    assert out.hidden[0, 1:4].abs().max() == 0  # the title's own slots carry no state
    torch.testing.assert_close(out.sentence, want.sentence)
