"""Figures written as files (matplotlib's Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from tibnlp.fsutil import atomic_file


def confusion_png(
    confusion: Sequence[Sequence[int]], labels: Sequence[str], path: Path, title: str = ""
) -> Path:
    """Row-normalised confusion matrix with raw counts in the cells, saved atomically."""
    cm = np.asarray(confusion, dtype=float)
    rows = cm.sum(axis=1, keepdims=True)
    norm = np.divide(cm, rows, out=np.zeros_like(cm), where=rows > 0)
    size = max(4.0, 0.55 * len(labels) + 2)
    fig, ax = plt.subplots(figsize=(size, size))
    ax.imshow(norm, cmap="Blues", vmin=0.0, vmax=1.0)
    ax.set_xticks(range(len(labels)), labels=list(labels), rotation=60, ha="right")
    ax.set_yticks(range(len(labels)), labels=list(labels))
    ax.set_xlabel("predicted")
    ax.set_ylabel("gold")
    if title:
        ax.set_title(title)
    for i in range(cm.shape[0]):
        for j in range(cm.shape[1]):
            if cm[i, j]:
                color = "white" if norm[i, j] > 0.5 else "black"
                ax.text(j, i, str(int(cm[i, j])), ha="center", va="center", fontsize=7, color=color)
    fig.tight_layout()
    return save_png(fig, path)


def save_png(fig: Any, path: Path, dpi: int = 120) -> Path:
    """Write a figure atomically (temporary file, then rename) and close it."""
    path = Path(path)
    try:
        with atomic_file(path, suffix=".png") as tmp:
            fig.savefig(tmp, dpi=dpi)
    finally:
        plt.close(fig)
    return path
