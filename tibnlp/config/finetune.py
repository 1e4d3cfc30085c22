"""Settings of fine-tuning a pretrained encoder on a labelled task."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tibnlp.config.core import check
from tibnlp.config.train import OptimizerConfig


@dataclass
class FinetuneConfig:
    model: str = ""  # pretrained model directory (or empty for random init, a baseline)
    dataset: str = "tncc"
    task: Literal["title", "document"] = "title"
    head: Literal["cnn", "linear"] = "cnn"
    freeze_encoder: bool = False
    max_len: int = 0  # 0: task default (50 titles, 300 documents)
    batch_size: int = 32
    epochs: int = 10
    patience: int = 3  # epochs without validation macro-F1 gain before stopping
    seeds: list[int] = field(default_factory=lambda: [1])
    cnn_kernels: list[int] = field(default_factory=lambda: [2, 3, 4])
    cnn_channels: int = 128
    dropout: float = 0.1
    output: str = "runs/finetune"
    eval_also: list[str] = field(default_factory=list)  # e.g. ["advts"]
    optimizer: OptimizerConfig = field(
        default_factory=lambda: OptimizerConfig(lr=5e-5, warmup_steps=0, weight_decay=0.01)
    )

    def validate(self, prefix: str) -> None:
        check(self.max_len >= 0, f"{prefix}.max_len", "must be >= 0 (0 = task default)")
        check(self.batch_size >= 1, f"{prefix}.batch_size", "must be >= 1")
        check(self.epochs >= 1, f"{prefix}.epochs", "must be >= 1")
        check(len(self.seeds) >= 1, f"{prefix}.seeds", "needs at least one seed")
        check(all(k >= 1 for k in self.cnn_kernels), f"{prefix}.cnn_kernels", "widths must be >= 1")
