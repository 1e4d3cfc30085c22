"""Segment recurrence (MODELS.md section 4): memory, gradient stop, long documents."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from design_models import tiny as base_tiny

from tibnlp.config.model import HeadsConfig, ModelConfig, RecurrenceConfig
from tibnlp.models import AlbertForPretraining, Encoder
from tibnlp.models.long_documents.windows import (
    SegmentReader,
    encode_long,
    run_segments,
    segments,
)


def tiny(mem_len: int = 8, **kw: object) -> ModelConfig:
    rec = RecurrenceConfig(mem_len=mem_len)
    return base_tiny(**{"position": "relative", "recurrence": rec, **kw})


def doc(lengths: list[int], t: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, 40, (len(lengths), t), generator=g)
    ids[:, 0] = 2  # [CLS]
    mask = (torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]).long()
    return ids.masked_fill(mask == 0, 0), mask


def test_memory_shapes_and_mem_len() -> None:
    enc = Encoder(tiny(mem_len=6)).eval()
    ids, mask = doc([5, 5], 5)
    out1 = enc(ids, mask)
    assert out1.memory is not None and len(out1.memory.states) == 2
    assert out1.memory.states[0].shape == (2, 5, 32)
    out2 = enc(ids, mask, memory=out1.memory)
    assert out2.memory is not None
    assert out2.memory.states[1].shape == (2, 6, 32) and out2.memory.mask.shape == (2, 6)
    # Layer 0's memory is the embedded input of the last 6 positions read.
    emb = enc.embeddings(ids, torch.zeros_like(ids))
    torch.testing.assert_close(out2.memory.states[0][:, 1:], emb)
    assert Encoder(tiny(mem_len=0)).eval()(ids, mask).memory is None


def test_gradients_do_not_flow_into_the_memory() -> None:
    torch.manual_seed(0)
    enc = Encoder(tiny())
    first = torch.tensor([[2, 11, 12, 13, 14]])  # tokens 11-14 only in the first segment
    second = torch.tensor([[2, 21, 22, 23, 24]])
    ones = torch.ones_like(first)
    out1 = enc(first, ones)
    assert out1.memory is not None
    assert all(not s.requires_grad and s.grad_fn is None for s in out1.memory.states)
    enc(second, ones, memory=out1.memory).hidden.sum().backward()
    grad = enc.embeddings.word.weight.grad
    assert grad is not None
    assert grad[11:15].abs().max().item() == 0.0  # nothing reached the first segment's tokens
    assert grad[21:25].abs().min().item() > 0.0


@pytest.mark.parametrize("mem_len", [8, 0])
def test_a_token_one_segment_back_is_seen_only_with_recurrence(mem_len: int) -> None:
    torch.manual_seed(0)
    enc = Encoder(tiny(mem_len=mem_len)).eval()
    ids, mask = doc([13], 13)  # segments of 5: [CLS]+4, [CLS]+4, [CLS]+4
    other = ids.clone()
    other[0, 6] = 39 if ids[0, 6] != 39 else 38  # second segment, read one segment before last
    a = encode_long(enc, ids, mask, segment_len=5)
    b = encode_long(enc, other, mask, segment_len=5)
    assert a.segments.tolist() == [3]
    changed = not torch.allclose(a.sentence, b.sentence, atol=1e-6)
    assert changed == (mem_len > 0)


def test_encode_long_of_a_short_document_is_the_encoder() -> None:
    enc = Encoder(tiny()).eval()
    ids, mask = doc([4, 6], 6)
    out = encode_long(enc, ids, mask, segment_len=8)
    plain = enc(ids, mask)
    torch.testing.assert_close(out.sentence, enc.sentence_vector(plain, mask))
    torch.testing.assert_close(out.hidden, plain.hidden)
    assert out.segments.tolist() == [1, 1]


def test_long_document_encoder_gives_document_states_to_a_head() -> None:
    enc = Encoder(tiny()).eval()
    ids, mask = doc([13, 6], 13)
    out = SegmentReader(enc, segment_len=5)(ids, mask)
    assert out.hidden.shape == (2, 13, 32) and out.hidden[1, 6:].abs().max() == 0
    # Position 0 is the [CLS] of the last segment; content tokens come from their segment.
    segs = list(run_segments(enc, ids, mask, 5))
    last_seg, last_out = segs[-1]
    assert last_seg.rows.tolist() == [0]
    torch.testing.assert_close(out.hidden[0, 0], last_out.hidden[0, 0])
    torch.testing.assert_close(out.hidden[0, 9:13], last_out.hidden[0, 1:5])
    torch.testing.assert_close(out.hidden[1, 1:5], segs[0][1].hidden[1, 1:5])


def test_encode_long_batches_documents_of_different_lengths() -> None:
    enc = Encoder(tiny()).eval()
    ids, mask = doc([13, 6, 9], 13)
    together = encode_long(enc, ids, mask, segment_len=5)
    assert together.segments.tolist() == [3, 2, 2]
    for i, n in enumerate([13, 6, 9]):
        alone = encode_long(enc, ids[i : i + 1, :n], mask[i : i + 1, :n], segment_len=5)
        torch.testing.assert_close(together.sentence[i], alone.sentence[0], atol=1e-5, rtol=1e-5)


def test_segments_repeat_cls_and_cover_every_token() -> None:
    ids, mask = doc([10, 4], 10)
    segs = list(segments(ids, mask, 4))
    assert [s.rows.tolist() for s in segs] == [[0, 1], [0], [0]]
    assert all(bool((s.input_ids[:, 0] == 2).all()) for s in segs)
    covered = torch.cat([s.positions[1:] for s in segs])
    assert covered.tolist() == list(range(1, 10))
    with pytest.raises(ValueError, match="segment_len"):
        list(segments(ids, mask, 1))


def test_mlm_over_segments_matches_segmentwise_loss_and_trains() -> None:
    torch.manual_seed(0)
    model = AlbertForPretraining(tiny(), segment_len=5)
    ids, mask = doc([9, 5], 9)
    labels = torch.full_like(ids, -100)
    labels[0, 2], labels[0, 7], labels[1, 3] = 12, 15, 30
    out = model(ids, mask, None, labels)
    assert out["segments"].item() == 2
    # By hand: segment 1 = positions 0..4 of both, segment 2 = [CLS] + 5..8 of document 0.
    first = model.encoder(ids[:, :5], mask[:, :5])
    h2 = model.encoder(
        torch.cat([ids[:1, :1], ids[:1, 5:9]], 1),
        torch.ones(1, 5, dtype=torch.long),
        memory=first.memory.select(torch.tensor([0])) if first.memory else None,
    ).hidden
    logits = model.mlm_logits(torch.stack([first.hidden[0, 2], first.hidden[1, 3], h2[0, 3]]))
    ref = F.cross_entropy(logits, torch.tensor([12, 30, 15]))
    torch.testing.assert_close(out["loss"], ref)
    out["loss"].backward()
    assert model.mlm_bias.grad is not None
    none = model(ids, mask, None, torch.full_like(ids, -100))
    assert none["loss"].item() == 0.0 and none["loss"].requires_grad


def test_sentence_rule_routes_keep_the_memory() -> None:
    cfg = tiny(heads=HeadsConfig(small=2, large=4, threshold=3, rule="sentence"))
    enc = Encoder(cfg).eval()
    full, ones = doc([5, 5], 5, seed=1)
    ids, mask = doc([5, 2], 5)  # the second document ends inside this segment
    out1 = enc(full, ones)
    out2 = enc(ids, mask, memory=out1.memory)
    assert out2.large.tolist() == [True, False]
    alone = enc(full[1:], ones[1:])
    alone2 = enc(ids[1:, :2], mask[1:, :2], memory=alone.memory)
    torch.testing.assert_close(out2.hidden[1, :2], alone2.hidden[0], atol=1e-5, rtol=1e-5)
