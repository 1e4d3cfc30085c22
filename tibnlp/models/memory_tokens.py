"""Memory tokens (Burtsev et al. 2020; MODELS.md section 6): `model.memory_tokens: k` learned
[MEM] states prepended to every input inside the encoder; every token attends to them and they
attend to every token; the encoder drops them from its output. They carry no position
embedding, so the real tokens keep positions 0..n-1 and `max_len` still bounds the real input.
"""

from __future__ import annotations

import torch
from torch import nn


class MemoryTokens(nn.Module):
    """k learned memory states of width D, prepended to the embedded input."""

    def __init__(self, count: int, hidden: int, std: float = 0.02) -> None:
        super().__init__()
        self.count = count
        self.states = nn.Parameter(torch.randn(count, hidden) * std)

    def prepend(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, n, D], [B, n] bool -> [B, k + n, D], [B, k + n] (memory slots always real)."""
        b = x.shape[0]
        mem = self.states.to(x.dtype).unsqueeze(0).expand(b, -1, -1)
        real = torch.ones(b, self.count, dtype=torch.bool, device=mask.device)
        return torch.cat([mem, x], dim=1), torch.cat([real, mask], dim=1)
