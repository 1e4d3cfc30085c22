"""Runs side by side: group an experiment's runs by model configuration, mean and std over seeds.

Runs whose nested runs carry the same metrics (a fine-tuning stage over its seed runs) are
left out: the seeds are counted, not their aggregate again (which runs are read:
`run_selection`).
The grouping follows the toolkit's convention: the `tibnlp.model` tag (set by pipelines to the
variant's name) when runs carry it, plus the params that describe a model (head counts, scales,
fine-tuning head) wherever they differ between runs, then whatever still tells runs of one
group apart (dataset, system, a fine-tuning setting). Runs in one group are repeats (seeds).
"""

from __future__ import annotations

import csv
import fnmatch
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from mlflow.entities import Run

from tibnlp.errors import ConfigError, TibnlpError
from tibnlp.evaluation.counts import count_text, is_count, is_fraction
from tibnlp.evaluation.markdown import markdown_rows
from tibnlp.evaluation.spread import mean_std
from tibnlp.tracking.conventions import TAG_MODEL, TAG_WARNING, WARNING_MAJORITY
from tibnlp.tracking.reading import metric_value, read_client
from tibnlp.tracking.run_selection import experiment_runs, leaf_runs, split_finished

DEFAULT_GROUP_KEYS = (
    f"tag:{TAG_MODEL}",
    "model.heads.small",
    "model.heads.large",
    "model.heads.rule",
    "model.scales.windows",
    "model.scales.alpha",
    "finetune.task",
    "finetune.head",
    "finetune.init",  # a random-init twin is another system, not more seeds
    "finetune.encoder",  # TextCNN ("none")
)
# Runs those keys put together are split further by these when they differ within a group:
# the dataset and the system (`tibnlp finetune` tags every run with both; only pipelines set
# `tibnlp.model`), then any fine-tuning or model setting. Not these, which repeats may differ
# in: the seeds, where the output went, the device, the evaluation batch, extra test sets.
# The paths of the model, vocabulary and data do split: the system tag names a model by its
# folder's last name ("model" for every pipeline's), and one folder named relative and
# absolute is a row too many, where two models merged would be a mean of both.
SPLIT_KEYS = ("tag:dataset", "tag:system")
SETTING_PREFIXES = ("finetune.", "model.")
NOT_SETTINGS = frozenset(
    {
        "finetune.seed",
        "finetune.seeds",
        "finetune.output",
        "finetune.device",
        "finetune.eval_batch_size",
        "finetune.eval_also",
    }
)
# The headline numbers of a classification paper; `--metric 'test*'` lists every test metric.
DEFAULT_METRICS = ("test_accuracy", "test_*f1")


@dataclass
class Cell:
    values: list[float] = field(default_factory=list)
    count: bool = False  # a count of texts (`evaluation.counts`): never x100, once if all agree
    fraction: bool = False  # F1, accuracy, a flip rate...: the only metrics `--percent` scales

    @property
    def mean(self) -> float:
        return mean_std(self.values)[0]

    @property
    def std(self) -> float:
        return mean_std(self.values)[1] if self.values else 0.0

    def text(self, digits: int = 4, scale: float = 1.0) -> str:
        if not self.values:
            return ""
        if self.count:
            return count_text(self.mean, self.std)
        scale = scale if self.fraction else 1.0
        if len(self.values) == 1:
            return f"{scale * self.mean:.{digits}f}"
        return f"{scale * self.mean:.{digits}f} ± {scale * self.std:.{digits}f}"


@dataclass
class Comparison:
    group_keys: list[str]
    metrics: list[str]  # column names (metric, or "metric [pivot value]")
    # group values, the most runs behind one cell (`runs_text`: what the table shows), cells
    rows: list[tuple[list[str], int, list[Cell]]]
    # per row, the runs tagged `warning` (a seed stuck at the majority class): the means hold
    # them, so the runs column says so ("" or e.g. "1 at majority class: not a result")
    warnings: list[str] = field(default_factory=list)
    left_out: str = ""  # runs with the metrics that are not finished, in words (`split_finished`)

    def warning(self, i: int) -> str:
        return self.warnings[i] if i < len(self.warnings) else ""

    def runs(self, i: int) -> str:
        flag = self.warning(i)
        return runs_text(self.rows[i][2]) + (f" ({flag})" if flag else "")

    def headers(self) -> list[str]:
        return [k.removeprefix("tag:") for k in self.group_keys] + ["runs", *self.metrics]

    def table(self, digits: int = 4, scale: float = 1.0) -> list[list[str]]:
        """Cells as text; `scale=100` shows fractions as percentages, as papers print F1
        (nothing else: `evaluation.counts`)."""
        return [
            [*g, self.runs(i), *(c.text(digits, scale) for c in cells)]
            for i, (g, _, cells) in enumerate(self.rows)
        ]

    def markdown(self, digits: int = 4, scale: float = 1.0) -> str:
        return "\n".join(markdown_rows(self.headers(), self.table(digits, scale))) + "\n"

    def csv(self, scale: float = 1.0) -> str:
        """Machine-readable: mean and std in separate columns, full precision (times `scale`:
        `--percent` says x100 in every format, for fractions only); the runs as numbers (fewest
        and most behind one cell) and the warning in a column of its own, so a script reads
        integers where the table shows "1–3 (1 at majority class ...)"."""
        out = io.StringIO()
        writer = csv.writer(out)
        head = [k.removeprefix("tag:") for k in self.group_keys]
        head += ["runs min", "runs max", "warning"]
        for m in self.metrics:
            head += [f"{m} mean", f"{m} std"]
        writer.writerow(head)
        for i, (g, _, cells) in enumerate(self.rows):
            fewest, most = run_counts(cells)
            row = [*g, str(fewest), str(most), self.warning(i)]
            for c in cells:
                times = scale if c.fraction else 1.0  # a count or a loss stays as it is
                if c.values:
                    row += [repr(times * c.mean), repr(times * c.std)]
                else:
                    row += ["", ""]
            writer.writerow(row)
        return out.getvalue()


def runs_text(cells: Sequence[Cell]) -> str:
    """The runs behind a row's cells: "3", or "1–3" when its cells hold different counts
    (`--columns-by` splits a row's runs between columns; a metric some runs lack), not the
    largest count alone, which claimed three seeds beside a mean of one."""
    fewest, most = run_counts(cells)
    return str(fewest) if fewest == most else f"{fewest}–{most}"


def run_counts(cells: Sequence[Cell]) -> tuple[int, int]:
    """The fewest and most runs behind a row's cells ((0, 0) when none holds a value)."""
    counts = [len(c.values) for c in cells if c.values] or [0]
    return min(counts), max(counts)


def _value(run: object, key: str) -> str | None:
    data = run.data  # type: ignore[attr-defined]
    if key.startswith("tag:"):
        return data.tags.get(key[4:])
    return data.params.get(key)


def check_keys(runs: Sequence[Run], keys: Sequence[str], option: str) -> None:
    """Every key (param name or tag:NAME) is one some run carries: an unknown key would put
    every run in one blank group, as if it had been grouped."""
    for key in keys:
        if any(_value(r, key) is not None for r in runs):
            continue
        params = sorted({k for r in runs for k in r.data.params})
        shown = ", ".join(params[:12]) + (" ..." if len(params) > 12 else "")
        what = "tag" if key.startswith("tag:") else "param"
        raise ConfigError(
            f"{option} {key!r}: no run compared carries this {what}",
            f"give a param name ({shown or 'these runs have none'}) or tag:NAME for a tag, "
            f"e.g. tag:{TAG_MODEL}",
        )


def compare_runs(
    experiment: str,
    metrics: Sequence[str] = (),
    group_by: Sequence[str] = (),
    columns_by: str = "",
    uri: str = "",
    filter_string: str = "",
    order: Literal["start", "natural"] = "start",
) -> Comparison:
    """Group the finished runs of `experiment` and aggregate `metrics` (glob patterns).

    `group_by`: param names or `tag:NAME`; default: the model-describing keys that vary.
    `columns_by`: a param or tag whose values become column suffixes (e.g. `finetune.head`
    puts "with CNN" and "without" side by side, as the papers' tables do).
    `order`: rows in the order their first run started (a pipeline's variant order, e.g.
    fixed heads before dynamic pairs) or sorted by the group values ("6" before "12").
    """
    client = read_client(uri)
    patterns = list(metrics) or list(DEFAULT_METRICS)

    def matching(run: object) -> set[str]:
        keys = run.data.metrics  # type: ignore[attr-defined]
        return {k for k in keys if any(fnmatch.fnmatch(k, p) for p in patterns)}

    runs, left_out = split_finished(
        leaf_runs(experiment_runs(client, experiment, filter_string), matching)
    )
    names = sorted({k for r in runs for k in matching(r)})
    if not names:
        raise TibnlpError(
            f"no finished run of {experiment!r} has a metric matching {', '.join(patterns)}",
            f"the runs that have one are not finished ({left_out}): compare once they end"
            if left_out
            else "list metric names in `tibnlp ui`, or pass --metric PATTERN (globs allowed)",
        )
    check_keys(runs, group_by, "--group-by")
    check_keys(runs, [columns_by] if columns_by else [], "--columns-by")
    if group_by:
        keys = list(group_by)
    else:  # the model-describing keys whose value differs between runs
        keys = [
            k
            for k in DEFAULT_GROUP_KEYS
            if k != columns_by and len({_value(r, k) for r in runs}) > 1
        ]
        model = DEFAULT_GROUP_KEYS[0]  # never the pivot too: one value per row, a diagonal
        if not keys and model != columns_by and any(_value(r, model) for r in runs):
            keys = [model]
        keys += splitting_keys(runs, keys, columns_by)
    pivots = sorted({_value(r, columns_by) or "" for r in runs}) if columns_by else [""]
    columns = [(m, p) for m in names for p in pivots]
    groups: dict[tuple[str, ...], dict[tuple[str, str], Cell]] = {}
    started: dict[tuple[str, ...], int] = {}
    warned: dict[tuple[str, ...], dict[tuple[str, str], int]] = {}  # (pivot, warning) -> runs
    plain = keys if group_by else [k for k in keys if k in DEFAULT_GROUP_KEYS]
    values = {r.info.run_id: g for r, g in zip(runs, group_values(runs, keys, plain), strict=True)}
    for r in sorted(runs, key=lambda r: r.info.start_time or 0):
        gkey = values[r.info.run_id]
        pivot = (_value(r, columns_by) or "") if columns_by else ""
        cells = groups.setdefault(
            gkey, {c: Cell(count=is_count(c[0]), fraction=is_fraction(c[0])) for c in columns}
        )
        started.setdefault(gkey, len(started))
        warning = r.data.tags.get(TAG_WARNING)
        if warning:
            counts = warned.setdefault(gkey, {})
            counts[(pivot, warning)] = counts.get((pivot, warning), 0) + 1
        for m in names:
            value = metric_value(r.data.metrics[m]) if m in r.data.metrics else math.nan
            if not math.isnan(value):  # NaN: not known (a flip rate with no text read)
                cells[(m, pivot)].values.append(value)
    rows, warnings = [], []
    for gkey in sorted(groups, key=_natural if order == "natural" else started.__getitem__):
        cells = groups[gkey]
        n = max(len(c.values) for c in cells.values()) if cells else 0
        rows.append((list(gkey), n, [cells[c] for c in columns]))
        warnings.append(_warning_text(warned.get(gkey, {})))
    labels = [f"{m} [{p}]" if columns_by else m for m, p in columns]
    return Comparison(keys, labels, rows, warnings, left_out)


def splitting_keys(runs: Sequence[Run], keys: Sequence[str], columns_by: str = "") -> list[str]:
    """The keys that tell apart runs `keys` would put in one group: its runs would be taken
    for seeds of one system, and a mean over two datasets, two pretrained models or two
    learning rates printed as "4 runs". Runs without a key are not told apart by it
    (`group_values`)."""
    settings = sorted(
        {k for r in runs for k in r.data.params if k.startswith(SETTING_PREFIXES)}
        - NOT_SETTINGS
        - set(DEFAULT_GROUP_KEYS)
    )
    chosen = list(keys)
    for key in (*SPLIT_KEYS, *settings):
        if key in chosen or key == columns_by:
            continue
        seen: dict[tuple[str, ...], str] = {}
        for r, group in zip(runs, group_values(runs, chosen, keys), strict=True):
            value = _value(r, key)
            if value is not None and seen.setdefault(group, value) != value:
                chosen.append(key)
                break
    return chosen[len(keys) :]


def group_values(
    runs: Sequence[Run], keys: Sequence[str], plain: Sequence[str] = ()
) -> list[tuple[str, ...]]:
    """Each run's values of `keys` ("" where it has none). Of a key not in `plain` (one that
    `splitting_keys` added), a run without it takes the one value the runs of its group that
    have it agree on: a run of an older version, without a setting added since, stays with
    the runs of its system instead of a row of its own."""
    groups: list[tuple[str, ...]] = [() for _ in runs]
    for key in keys:
        values = [_value(r, key) for r in runs]
        known: dict[tuple[str, ...], set[str]] = {}
        for group, value in zip(groups, values, strict=True):
            if value is not None:
                known.setdefault(group, set()).add(value)
        groups = [
            (*g, v if v is not None else _only(known.get(g), key not in plain))
            for g, v in zip(groups, values, strict=True)
        ]
    return groups


def _only(values: set[str] | None, fill: bool) -> str:
    return next(iter(values)) if fill and values and len(values) == 1 else ""


def _warning_text(counts: dict[tuple[str, str], int]) -> str:
    """The warned runs of a row in words (with their column's pivot value under
    `--columns-by`): a seed at the majority class is not a result."""
    names = {WARNING_MAJORITY: "at majority class: not a result"}
    return "; ".join(
        f"{n}{f' [{pivot}]' if pivot else ''} {names.get(w, f'warning {w}')}"
        for (pivot, w), n in sorted(counts.items())
    )


def _natural(key: tuple[str, ...]) -> tuple[tuple[int, float, str], ...]:
    """Sort "6" before "12" and text alphabetically."""
    out = []
    for part in key:
        try:
            out.append((0, float(part), ""))
        except ValueError:
            out.append((1, 0.0, part))
    return tuple(out)
