"""Published results and targets to read our numbers against (percent, test split).

Each paper used its own random split of TNCC (data directory: tncc/ANCHORS.md), so these are
reference lines, not rows of one experiment. The targets are issue 11's stretch goal for
TNCC titles (mean of 3 fine-tuning seeds).
"""

from __future__ import annotations

# Published TNCC title results (macro-F1, test; each paper its own split)
TNCC_TITLE_ANCHORS = {
    "CBOW": 57.84,
    "TiBERT": 61.72,
    "DMA-ALBERT + CNN (seed paper)": 64.47,
    "DAN-FastText": 64.53,
}

# dataset -> metric -> {name: value}
ANCHORS: dict[str, dict[str, dict[str, float]]] = {"tncc-title": {"macro_f1": TNCC_TITLE_ANCHORS}}
TARGETS: dict[str, dict[str, float]] = {"tncc-title": {"macro_f1": 64.5, "weighted_f1": 68.7}}


def anchors_for(dataset: str, metric: str) -> dict[str, float]:
    """Published values of `metric` (e.g. "macro_f1") on `dataset`; {} when none."""
    return dict(ANCHORS.get(dataset, {}).get(metric, {}))


def target_for(dataset: str, metric: str) -> float | None:
    return TARGETS.get(dataset, {}).get(metric)
