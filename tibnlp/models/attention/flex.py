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


BLOCK = 128  # FlexAttention's default tile (queries and keys)
# 64 lets narrow windows skip more key tiles at N=512 (22 of 64 against 10 of 16), yet the
# compiled layer ran 1-2 % faster only (H200, benchmarks/results/gpu.md): 128 stays the default
TILES = (64, 128)


def kernel_options(tile: int) -> dict[str, int] | None:
    """The Triton tiles for a `tile`-token block mask: a block mask's tile must be a multiple
    of the kernel's, whose defaults for bf16 on sm90 are 128 queries (forward); None keeps
    torch's defaults for the 128-token mask."""
    if tile not in TILES:
        raise ValueError(f"FlexAttention tile {tile}: use one of {TILES}")
    if tile == BLOCK:
        return None
    names = ("BLOCK_M", "BLOCK_N", "BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2")
    return dict.fromkeys(names, tile)


def window_mask(radius: torch.Tensor, lengths: torch.Tensor, n: int, tile: int = BLOCK) -> Any:
    """The `BlockMask` of windows: query i of row b, head h sees keys j with |i - j| <=
    radius[b, h] inside the row's real length; a padding query also sees itself (as in
    multiscale._allowed, so no row is empty).

    Built from the windows' geometry on the [B, H, N/tile, N/tile] grid, not by evaluating
    the mask on every (query, key) pair as `create_block_mask` does: that build alone took
    0.74x a dense layer's whole step at N=512 on an H200 (benchmarks/results/gpu.md). Tiles
    are classified exactly as `create_block_mask` does (tests/test_flex_window.py); the
    mask function still decides inside the partial tiles."""
    from torch.nn.attention.flex_attention import BlockMask

    def mask_mod(b: Any, h: Any, q: Any, k: Any) -> Any:
        length = lengths[b]
        inside = ((q - k).abs() <= radius[b, h]) & (k < length)
        return inside | ((q == k) & (q >= length))

    tiles = (n + tile - 1) // tile
    start = torch.arange(tiles, device=radius.device) * tile
    last = (start + tile - 1).clamp(max=n - 1)  # the tile's last real position
    qs, qe = start[:, None], last[:, None]  # query tiles down, key tiles across
    ks, ke = start[None, :], last[None, :]
    r = radius[:, :, None, None]
    length = lengths.to(radius.device)[:, None, None, None]
    key_end = torch.minimum(ke, length - 1)  # the last real key of the tile
    gap = torch.maximum(ks - qe, qs - key_end).clamp(min=0)  # nearest (query, real key) pair
    near = (ks < length) & (gap <= r)
    diagonal = torch.maximum(torch.maximum(qs, ks), length) <= torch.minimum(qe, ke)
    # full: both tiles whole inside N, every key real, every pair within the radius
    whole = start + tile <= n
    span = torch.maximum(qe - ks, ke - qs)
    full = whole[:, None] & whole[None, :] & (ke < length) & (span <= r)
    partial = (near | diagonal) & ~full

    def ordered(tiles_on: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        count = tiles_on.sum(-1, dtype=torch.int32)
        order = torch.argsort(tiles_on.to(torch.int8), dim=-1, descending=True, stable=True)
        return count, order.to(torch.int32)

    return BlockMask.from_kv_blocks(
        *ordered(partial), *ordered(full), BLOCK_SIZE=tile, mask_mod=mask_mod, seq_lengths=(n, n)
    )


def flex_window_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    radius: torch.Tensor,
    lengths: torch.Tensor,
    compile: bool | None = None,
    tile: int = BLOCK,
) -> torch.Tensor:
    """q, k, v [B, H, N, d]; radius [B, H] long (per row and head); lengths [B] -> [B, H, N, d].

    Compiled on CUDA by default; eager elsewhere (torch's unfused implementation: forward only
    on CPU, which is what the CPU test of this path uses). `tile`: the block mask's and the
    kernel's tile, 128 or 64."""
    from torch.nn.attention.flex_attention import flex_attention

    if compile is None:
        compile = q.is_cuda
    options = kernel_options(tile)
    mask = window_mask(radius, lengths, q.shape[-2], tile)
    run = _compiled() if compile else flex_attention
    return run(q, k, v, block_mask=mask, kernel_options=options)
