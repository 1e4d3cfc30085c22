"""GEMFormer's first pass with prefixes and segment recurrence: a document's states must not
depend on the other documents of its batch (padding changes no real output)."""

from __future__ import annotations

import torch
from design_models import tiny as base_tiny

from tibnlp.config.model import RecurrenceConfig
from tibnlp.models import Encoder
from tibnlp.models.long_documents.gemformer import _head, read_with_heads


def test_prefix_rows_of_different_length_keep_their_states_in_a_batch() -> None:
    torch.manual_seed(0)
    cfg = base_tiny(position="relative", recurrence=RecurrenceConfig(mem_len=16))
    enc = Encoder(cfg).eval()
    with torch.no_grad():  # relative biases off zero, so distances matter visibly
        for name, p in enc.named_parameters():
            if ".core." in name:
                p.normal_(0, 0.5)
    ids = torch.randint(10, 40, (2, 30))
    ids[:, 0] = 2
    mask = torch.ones_like(ids)
    prefixes = [[11], [12, 13, 14, 15]]  # row 0's rows are padded by 3 in the batch

    def states(rows: slice) -> list[torch.Tensor]:
        pre = prefixes[rows]
        with torch.no_grad():
            return [
                out.hidden[0, : int(m[0].sum())]
                for _, out, _, m in read_with_heads(
                    enc, ids[rows], mask[rows], 10, lambda r: _head(pre, r), recurrent=True
                )
            ]

    alone, batch = states(slice(0, 1)), states(slice(0, 2))
    assert len(alone) == len(batch) >= 3
    for a, b in zip(alone, batch, strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=0)
