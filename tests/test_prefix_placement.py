"""`MemoryReader(prefix=True)`: each document's states go back to where the document sits in
its input row, whatever the prefix (empty included) and whatever else the batch holds."""

from __future__ import annotations

import torch
from design_models import tiny

from tibnlp.models import Encoder
from tibnlp.models.long_documents.memory_reader import MemoryReader


def _batch(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    n = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), n, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, row in enumerate(rows):
        ids[b, : len(row)] = torch.tensor(row)
        mask[b, : len(row)] = 1
    return ids, mask


def test_document_states_sit_at_the_documents_positions() -> None:
    torch.manual_seed(0)
    reader = MemoryReader(Encoder(tiny()), 8, threshold=100.0, budget=3, prefix=True).eval()
    titled = [2, 15, 3, 11, 12, 13, 3]  # [CLS] prefix [SEP] document [SEP]
    untitled = [2, 3, 11, 12, 13, 14, 3]  # an empty prefix
    plain = [2, 21, 22, 23, 24, 25, 26, 27]  # no pair at all, the batch's longest row
    with torch.no_grad():
        for row, start in ((titled, 2), (untitled, 1)):
            alone = reader(*_batch([row])).hidden[0]
            assert alone[1 : start + 1].abs().max() == 0  # the prefix and its [SEP]
            assert (alone[start + 1 : len(row)].norm(dim=-1) > 0).all()  # the document
            mixed = reader(*_batch([row, plain])).hidden[0, : len(row)]
            torch.testing.assert_close(mixed, alone, atol=1e-5, rtol=0)
