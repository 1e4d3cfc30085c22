"""Multi-scale windows on CUDA through FlexAttention with a per-head window `BlockMask`.

One fused kernel for every windowed head of a layer, whatever its scale: the block mask skips
key blocks outside each head's window (the work is O(N w) per head, not O(N^2)), where the
CPU path (multiscale.py) runs one banded or blocked product per scale. Only on CUDA: inductor
builds the Triton kernel there, while on CPU flex attention cannot train through inductor.
Attention dropout is not expressible as a mask, so training with `attention_dropout > 0`
keeps the per-scale path (ALBERT's setting is 0).
"""

from __future__ import annotations

import functools
from typing import Any

import torch


def flex_available(q: torch.Tensor) -> bool:
    """CUDA tensors and a torch that ships FlexAttention."""
    if not q.is_cuda:
        return False
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def _compiled() -> Any:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def window_mask(radius: torch.Tensor, lengths: torch.Tensor, n: int, compile: bool) -> Any:
    """The `BlockMask` of windows: query i of row b, head h sees keys j with |i - j| <=
    radius[b, h] inside the row's real length; a padding query sees only itself (as in
    multiscale._allowed, so no row is empty)."""
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(b: Any, h: Any, q: Any, k: Any) -> Any:
        length = lengths[b]
        inside = ((q - k).abs() <= radius[b, h]) & (k < length)
        return inside | ((q == k) & (q >= length))

    b, heads = radius.shape
    return create_block_mask(mask_mod, b, heads, n, n, device=radius.device, _compile=compile)


def flex_window_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    radius: torch.Tensor,
    lengths: torch.Tensor,
    compile: bool | None = None,
) -> torch.Tensor:
    """q, k, v [B, H, N, d]; radius [B, H] long (per row and head); lengths [B] -> [B, H, N, d].

    Compiled on CUDA by default; eager elsewhere (torch's unfused implementation: forward only
    on CPU, which is what the CPU test of this path uses)."""
    from torch.nn.attention.flex_attention import flex_attention

    if compile is None:
        compile = q.is_cuda
    mask = window_mask(radius, lengths, q.shape[-2], compile)
    run = _compiled() if compile else flex_attention
    return run(q, k, v, block_mask=mask)
