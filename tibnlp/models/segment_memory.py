"""The recurrence memory one encoder call hands to the next (Transformer-XL; MODELS.md
section 4): what `Encoder.forward(..., memory=)` takes and `EncoderOutput.memory` gives.

A piece below the encoder: it knows nothing of segments or documents (those are
`tibnlp.models.long_documents.windows`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SegmentMemory:
    """Per layer l, `states[l]` [B, M, D]: the inputs of layer l over the last M positions
    read (detached); `mask` [B, M] bool marks which of them were real tokens.

    Relative distances count positions of the concatenation [memory; segment]; a row's real
    memory states sit at its end (`next_memory` moves padding to the front), so padding inside
    a segment does not change them.
    """

    states: list[torch.Tensor]
    mask: torch.Tensor

    def select(self, index: torch.Tensor) -> SegmentMemory:
        """The memory of the documents (rows) `index`."""
        index = index.to(self.mask.device)
        return SegmentMemory([s.index_select(0, index) for s in self.states], self.mask[index])


def next_memory(
    previous: SegmentMemory | None, states: list[torch.Tensor], mask: torch.Tensor, mem_len: int
) -> SegmentMemory:
    """Append this segment's layer inputs to the memory, keep the last `mem_len`, stop grads."""
    if previous is not None:
        states = [torch.cat([p, s], dim=1) for p, s in zip(previous.states, states, strict=True)]
        mask = torch.cat([previous.mask, mask], dim=1)
    # each row's real states last, in order (padding first): a row padded inside the batch
    # (e.g. GEMFormer rows with prefixes of different lengths) keeps the distances it has alone
    order = torch.argsort(mask.to(torch.uint8), dim=1, stable=True)
    mask = mask.gather(1, order)
    states = [s.gather(1, order.unsqueeze(-1).expand_as(s)) for s in states]
    return SegmentMemory([s[:, -mem_len:].detach() for s in states], mask[:, -mem_len:])
