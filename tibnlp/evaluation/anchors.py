"""Published results to read our numbers against: the one place they are kept (percent, test).

Each paper used its own random split of TNCC (the data directory's tncc/ANCHORS.md collects
them with their details), so they are reference lines beside a table or a curve, never rows
of one experiment. Reports, plots and pipeline summaries all read them from here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Anchor:
    name: str
    value: float  # percent
    source: str


# TNCC titles, test macro-F1 (each paper its own ~8:1:1 split)
TNCC_TITLE_MACRO_F1 = (
    Anchor(
        "CBOW",
        57.84,
        "Qun et al., CCL 2017 (TNCC's paper): FudanNLP/Tibetan-Classification 'title classes.xlsx',"
        " macro average",
    ),
    Anchor(
        "TiBERT",
        61.72,
        "derived from DAN-FastText's paper, which reports +2.81 over TiBERT (TiBERT's own tables"
        " are images only)",
    ),
    Anchor(
        "DMA-ALBERT + CNN (seed paper)",
        64.47,
        "Zhang Ying, Yong Cuo, Yu Tao (Tibet University), dynamic multi-head attention ALBERT,"
        " heads (6, 8)",
    ),
    Anchor(
        "DAN-FastText",
        64.53,
        "Li Guo, Chen Chen, Yang Jin, Qun Nuo, Computer Science 2024, 51(6A):230700064;"
        " GitHub LG2016/DAN-FastText",
    ),
)


# dataset -> metric -> anchors
ANCHORS: dict[str, dict[str, tuple[Anchor, ...]]] = {
    "tncc-title": {"macro_f1": TNCC_TITLE_MACRO_F1},
}


def anchors_for(dataset: str, metric: str) -> tuple[Anchor, ...]:
    """Published test values of `metric` ("macro_f1", ...) on `dataset`; () when none."""
    return ANCHORS.get(dataset, {}).get(metric, ())
