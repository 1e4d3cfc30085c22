"""The learning curve: fine-tuning scores (mean and spread over seeds) against the pretraining
behind the encoder, in tokens (log axis) and in CPU-hours, with the systems that had no
pretraining (the random-init twin: the 0-token point; TextCNN) and published results as
reference lines. Pure data and drawing; `tibnlp.tracking.curve` reads the runs from MLflow.
"""

from __future__ import annotations

import math
import textwrap
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from matplotlib.axes import Axes
from matplotlib.lines import Line2D

from tibnlp.evaluation.anchors import anchors_for
from tibnlp.evaluation.plots import plt, save_png
from tibnlp.evaluation.spread import mean_std

Kind = Literal["pretrained", "random", "textcnn"]
PART_STYLE = {"test": "-", "validation": "--"}
LEGEND_WIDTH = 44  # characters a legend label's line holds: four columns span the figure
# a line style does not show on one point (a curve of one export): the marker tells them apart
PART_MARKER = {"test": "o", "validation": "s"}
PART_FILL = {"test": "full", "validation": "none"}
REFERENCE_COLOR = {"random": "tab:red", "textcnn": "tab:green"}
REFERENCE_LABEL = {"random": "random-init twin (0 tokens)", "textcnn": "TextCNN"}


@dataclass
class CurveRun:
    """One fine-tuning seed run placed on the curve."""

    kind: Kind
    tokens: float  # pretraining tokens (0 for random/textcnn)
    hours: float | None  # pretraining seconds x processes / 3600 (CPU-hours on a CPU)
    values: dict[str, float]  # part ("test", "validation") -> metric value (a fraction)
    series: str = ""  # the curve it belongs to ("" when there is only one)
    experiment: str = ""
    run_id: str = ""
    dataset: str = ""
    warning: str = ""  # e.g. "majority_class"


@dataclass
class Stat:
    mean: float
    std: float  # sample std over seeds; 0 for one seed
    n: int


@dataclass
class Point:
    """Seeds of one system at one pretraining amount."""

    series: str
    kind: Kind
    tokens: float
    hours: float | None
    values: dict[str, Stat]
    warnings: int = 0  # seeds flagged (e.g. at the majority-class level)


@dataclass
class Curve:
    metric: str
    parts: list[str]
    points: list[Point] = field(default_factory=list)
    dataset: str = ""

    def of(self, kind: Kind) -> list[Point]:
        return [p for p in self.points if p.kind == kind]


def _stat(values: Sequence[float]) -> Stat:
    return Stat(*mean_std(values), len(values))


def aggregate_curve(runs: Sequence[CurveRun], metric: str, parts: Sequence[str]) -> Curve:
    """Seeds grouped by (series, kind, tokens): mean and std per part, points by tokens."""
    groups: dict[tuple[str, Kind, float], list[CurveRun]] = defaultdict(list)
    for run in runs:
        groups[(run.series, run.kind, run.tokens)].append(run)
    datasets = sorted({r.dataset for r in runs if r.dataset})
    curve = Curve(metric, list(parts), dataset=datasets[0] if len(datasets) == 1 else "")
    for (series, kind, tokens), seeds in sorted(groups.items(), key=lambda g: (g[0][0], g[0][2])):
        hours = [s.hours for s in seeds if s.hours is not None]
        values = {p: _stat([s.values[p] for s in seeds]) for p in parts}
        point = Point(series, kind, tokens, float(np.mean(hours)) if hours else None, values)
        point.warnings = sum(bool(s.warning) for s in seeds)
        curve.points.append(point)
    return curve


def _label(series: str, part: str) -> str:
    return f"{series}: {part}" if series else part


def _references(ax: Axes, curve: Curve, labelled: bool) -> None:
    """Horizontal lines: the systems without pretraining (with their spread) and anchors."""
    for kind in ("random", "textcnn"):
        for point in curve.of(kind):
            for part in curve.parts:
                stat = point.values[part]
                mean, std = 100 * stat.mean, 100 * stat.std
                color = REFERENCE_COLOR[kind]
                name = REFERENCE_LABEL[kind] + (f" [{point.series}]" if point.series else "")
                if point.warnings:  # a stuck baseline is no reference: the gain over it is not
                    name += f" (NOT LEARNING: {point.warnings}/{stat.n} seeds at majority class)"
                ax.axhline(
                    mean, color=color, ls=PART_STYLE.get(part, ":"), lw=1.2,
                    label=f"{name}: {part} {mean:.1f}",
                )  # fmt: skip
                if std:
                    ax.axhspan(mean - std, mean + std, color=color, alpha=0.08)
    if "test" not in curve.parts:
        return
    for value, names in _anchor_lines(curve):
        ax.axhline(value, color="0.45", ls=":", lw=0.9)
        if labelled:
            ax.annotate(
                names, xy=(1.0, value), xycoords=("axes fraction", "data"), xytext=(3, 0),
                textcoords="offset points", va="center", fontsize=7, color="0.35",
            )  # fmt: skip


def _anchor_lines(curve: Curve, close: float = 0.5) -> list[tuple[float, str]]:
    """Published test values as (value, label); values closer than `close` points share one
    line and one label, so the labels stay readable."""
    lines: list[tuple[float, str]] = []
    for anchor in sorted(anchors_for(curve.dataset, curve.metric), key=lambda a: a.value):
        text = f"{anchor.name} {anchor.value:.2f}"
        if lines and anchor.value - lines[-1][0] < close:
            lines[-1] = (lines[-1][0], f"{lines[-1][1]} / {text}")
        else:
            lines.append((anchor.value, text))
    return lines


def _panel(ax: Axes, curve: Curve, axis: Literal["tokens", "hours"], labelled: bool) -> bool:
    """One panel; False when no point has that x value (e.g. no CPU-hours recorded)."""
    drawn = False
    series = sorted({p.series for p in curve.of("pretrained")})
    for i, name in enumerate(series):
        points = [p for p in curve.of("pretrained") if p.series == name]
        xs = [p.tokens if axis == "tokens" else p.hours for p in points]
        keep = [(x, p) for x, p in zip(xs, points, strict=True) if x is not None and x > 0]
        # points come by tokens; CPU-hours need not grow with them: draw the line along x
        keep.sort(key=lambda k: k[0])
        if not keep:
            continue
        drawn = True
        for part in curve.parts:
            x = [k[0] for k in keep]
            y = [100 * k[1].values[part].mean for k in keep]
            err = [100 * k[1].values[part].std for k in keep]
            ax.errorbar(
                x, y, yerr=err, color=f"C{i}", ls=PART_STYLE.get(part, ":"),
                marker=PART_MARKER.get(part, "^"), fillstyle=PART_FILL.get(part, "full"),
                ms=5, capsize=3, label=_label(name, part),
            )  # fmt: skip
            for xv, point in keep:  # seeds stuck at the majority class: not a result
                if point.warnings:
                    y0 = 100 * point.values[part].mean
                    ax.plot(xv, y0, "x", color="red", ms=9, mew=2)
    ax.set_xscale("log")
    ax.set_xlabel("pretraining tokens" if axis == "tokens" else "pretraining CPU-hours")
    _references(ax, curve, labelled)
    ax.grid(True, which="both", alpha=0.25)
    return drawn


def draw_curve(curve: Curve, path: Path, title: str = "") -> Path:
    """Two panels (tokens, CPU-hours) side by side, saved atomically as a PNG."""
    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
    name = curve.metric.replace("_", "-").replace("f1", "F1")
    for ax, axis in zip(axes, ("tokens", "hours"), strict=True):
        if not _panel(ax, curve, axis, labelled=axis == "hours"):  # type: ignore[arg-type]
            ax.text(0.5, 0.5, f"no pretrained point records {axis}", ha="center",
                    transform=ax.transAxes)  # fmt: skip
    axes[0].set_ylabel(f"{name} (%), mean ± std over seeds")
    handles, labels = axes[0].get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: isinstance(handles[i], Line2D))  # curves first
    handles, labels = [handles[i] for i in order], [labels[i] for i in order]
    # long labels (a pipeline's series names, a NOT LEARNING note) wrapped, so four columns
    # fit the figure's width instead of running off both sides of it
    labels = [textwrap.fill(label, LEGEND_WIDTH) for label in labels]
    rows = math.ceil(len(labels) / 4) if handles else 0
    lines = max((label.count("\n") + 1 for label in labels), default=1)
    # the figure grows by the legend's height (8-point lines), so the panels keep theirs
    legend_in = 0.17 * rows * lines + 0.25 if handles else 0.1
    fig.set_size_inches(13, 5 + legend_in)
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8,
                   bbox_to_anchor=(0.5, 0.0))  # fmt: skip
    fig.suptitle(title or f"learning curve: {name}")
    fig.tight_layout(rect=(0, legend_in / (5 + legend_in), 0.86, 1))
    return save_png(fig, path)
