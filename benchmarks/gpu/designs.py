"""Every attention design at a small shape, with a padded MLM + SOP batch, for the CUDA-vs-CPU
tests and the SDPA kernel report (one list, so the two cover the same designs)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tibnlp.config.model import (
    FusionConfig,
    HeadsConfig,
    ModelConfig,
    RecurrenceConfig,
    ScalesConfig,
)
from tibnlp.models.pretraining import AlbertForPretraining

WINDOWS = ["1", "3", "N/4", "N/2"]


@dataclass
class Design:
    name: str
    cfg: ModelConfig
    segment_len: int = 0  # recurrence: MLM over segments of this length, no SOP


def designs(hidden: int = 64, heads: int = 4, vocab: int = 96, max_len: int = 256) -> list[Design]:
    def cfg(**kw: object) -> ModelConfig:
        base: dict[str, object] = dict(
            vocab_size=vocab,
            embedding_size=16,
            hidden_size=hidden,
            num_layers=2,
            ffn_size=2 * hidden,
            max_len=max_len,
            heads=HeadsConfig(small=heads, large=heads),
            dropout=0.0,
            attention_dropout=0.0,
            initializer_range=0.2,  # attention far from uniform: differences show
        )
        base.update(kw)
        return ModelConfig(**base)  # type: ignore[arg-type]

    half = heads // 2
    return [
        Design("dense", cfg()),
        Design("dynamic heads, batch rule", cfg(heads=HeadsConfig(half, heads, 16, "batch"))),
        Design("dynamic heads, sentence rule", cfg(heads=HeadsConfig(half, heads, 16, "sentence"))),
        Design("multi-scale", cfg(scales=ScalesConfig(windows=WINDOWS))),
        Design("multi-scale, FFN-free", cfg(scales=ScalesConfig(windows=WINDOWS, ffn=False))),
        Design("relative", cfg(position="relative")),
        Design(
            "relative + recurrence",
            cfg(position="relative", recurrence=RecurrenceConfig(mem_len=8)),
            segment_len=8,
        ),
        Design("masked fusion (RPSAN)", cfg(fusion=FusionConfig(enabled=True))),
        Design("memory tokens", cfg(memory_tokens=2)),
    ]


def build(design: Design, seed: int = 0) -> AlbertForPretraining:
    torch.manual_seed(seed)
    return AlbertForPretraining(design.cfg, segment_len=design.segment_len)


def batch(
    design: Design, lengths: list[int], seed: int = 1, device: str | torch.device = "cpu"
) -> dict[str, torch.Tensor | None]:
    """Right-padded ids with ~15% MLM targets (never [CLS]) and SOP labels."""
    g = torch.Generator().manual_seed(seed)
    b, n = len(lengths), max(lengths)
    ids = torch.randint(5, design.cfg.vocab_size, (b, n), generator=g)
    mask = (torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]).long()
    ids = ids * mask
    ids[:, 0] = 2
    chosen = (torch.rand(b, n, generator=g) < 0.15) & mask.bool()
    chosen[:, 0] = False
    chosen[:, 1] = True  # at least one target per row
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    types = (torch.arange(n)[None, :] >= n // 2).long().expand(b, n) * mask
    out: dict[str, torch.Tensor | None] = {
        "input_ids": ids,
        "attention_mask": mask,
        "token_type_ids": types.contiguous(),
        "mlm_labels": labels,
        "sop_labels": None if design.segment_len else torch.randint(0, 2, (b,), generator=g),
    }
    return {k: None if v is None else v.to(device) for k, v in out.items()}
