"""Dense attention through PyTorch's fused `scaled_dot_product_attention`."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tibnlp.models.attention.base import AttentionContext, AttentionCore


class DenseCore(AttentionCore):
    """Every real token attends to every real token; padding keys are masked out.

    When the batch holds no padding the mask is dropped, which keeps SDPA on its fastest
    kernel (an explicit mask rules out flash attention on GPU). A query's weights depend on
    its own vector only, so any subset of queries is exact.
    """

    supports_query_subset = True

    def __init__(self, heads: int, dropout: float = 0.0) -> None:
        super().__init__(heads)
        self.dropout = dropout

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext
    ) -> torch.Tensor:
        mask = ctx.attention_mask
        n = k.shape[-2]
        # no mask for a full batch (flash takes it); always one under compile (no host sync)
        full = not torch.compiler.is_compiling() and int(ctx.lengths.min()) == n
        attn_mask = None if full else mask[:, None, None, :]
        p = self.dropout if self.training else 0.0
        if q.device.type == "cpu" and q.dtype == torch.bfloat16:
            # CPU SDPA backward in bf16 is 1.5-3.7x slower than in fp32 (torch 2.13, AMX CPU,
            # 12 heads of 32, N 128-512: benchmarks/results/vs_transformers.md); the
            # projections around it keep bf16's gain.
            with torch.autocast("cpu", enabled=False):
                out = F.scaled_dot_product_attention(
                    q.float(), k.float(), v.float(), attn_mask=attn_mask, dropout_p=p
                )
            return out.to(q.dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p)
