"""Fine-tuning runs placed on a learning curve: each seed run's score beside the pretraining
behind its model (the `pretrained.*` params fine-tuning records: tokens, seconds, processes).

A run is one of three kinds: `pretrained` (a point of the curve, at its tokens), `random` (the
same shape with fresh weights: the 0-token point) or `textcnn` (no encoder, the from-scratch
baseline). Drawing and aggregation are `tibnlp.evaluation.curve`'s; this module only reads.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from mlflow.entities import Run
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from tibnlp.errors import TibnlpError
from tibnlp.tracking.compare import finished_runs, leaf_runs
from tibnlp.tracking.conventions import PRETRAINED, TAG_PRETRAIN_RUN, TAG_WARNING
from tibnlp.tracking.tracker import default_tracking_uri

Kind = Literal["pretrained", "random", "textcnn"]
# what tells series apart when it varies: the pretraining run, and the head put on top
DEFAULT_SERIES_KEYS = (f"tag:{TAG_PRETRAIN_RUN}", "finetune.head")


@dataclass
class CurveRun:
    """One fine-tuning seed run."""

    experiment: str
    run_id: str
    kind: Kind
    series: str  # label of the curve it belongs to ("" when there is only one)
    tokens: float | None  # pretraining tokens (0 for random/textcnn; None: not recorded)
    hours: float | None  # pretraining wall seconds x processes / 3600 (CPU-hours on a CPU)
    values: dict[str, float]  # part ("test", "validation") -> metric value (a fraction)
    dataset: str = ""
    device: str = ""  # CPU model or GPU name the pretraining ran on
    warning: str = ""  # e.g. "not_learning"


@dataclass
class CurveRuns:
    metric: str
    parts: list[str]
    runs: list[CurveRun]
    skipped: list[str] = field(default_factory=list)  # why runs were left out, in words


def _number(params: dict[str, str], key: str) -> float | None:
    try:
        value = float(params[key])
    except (KeyError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _kind(params: dict[str, str]) -> Kind:
    if params.get("finetune.encoder") == "none":
        return "textcnn"
    if params.get("finetune.init") == "random" or params.get("finetune.model", "") in ("", "none"):
        return "random"
    if _number(params, f"{PRETRAINED}tokens") == 0:
        return "random"
    return "pretrained"


def _key_value(run: Run, key: str) -> str:
    if key.startswith("tag:"):
        return str(run.data.tags.get(key[4:], ""))
    return str(run.data.params.get(key, ""))


def read_curve_runs(
    experiments: Sequence[str],
    metric: str = "macro_f1",
    parts: Sequence[str] = ("test", "validation"),
    uri: str = "",
    filter_string: str = "",
    parents: Sequence[str] = (),
    series_keys: Sequence[str] = DEFAULT_SERIES_KEYS,
) -> CurveRuns:
    """The seed runs of `experiments` that carry `<part>_<metric>` for every part.

    `parents`: only runs nested under these run ids (a pipeline's fine-tuning stages), so
    runs left in the store by earlier invocations are not counted twice. An experiment with
    no run carrying the metric is an error naming both: a curve drawn without it would
    silently lie about what was compared.
    """
    if not experiments:
        raise TibnlpError("no experiment given", "pass --experiment NAME (repeatable)")
    client = MlflowClient(default_tracking_uri(uri))
    names = [f"{part}_{metric}" for part in parts]
    wanted = set(parents)
    found: list[tuple[str, Run]] = []
    for experiment in experiments:
        runs = finished_runs(client, experiment, filter_string)
        leaves = leaf_runs(runs, lambda r: all(n in r.data.metrics for n in names))
        if wanted:
            leaves = [r for r in leaves if r.data.tags.get("mlflow.parentRunId") in wanted]
        if not leaves:
            have = sorted({k for r in runs for k in r.data.metrics})
            shown = ", ".join(have[:12]) + (" ..." if len(have) > 12 else "")
            raise TibnlpError(
                f"experiment {experiment!r} has no finished run with metric "
                f"{' and '.join(repr(n) for n in names)}"
                + (" among the given parent runs" if wanted else ""),
                f"its metrics: {shown or 'none'}; choose another with --metric "
                "(macro_f1, weighted_f1, accuracy...) or --part",
            )
        found += [(experiment, r) for r in leaves]
    labels = _series_labels(client, [r for _, r in found], series_keys)
    result = CurveRuns(metric, list(parts), [])
    for (experiment, run), series in zip(found, labels, strict=True):
        params = run.data.params
        kind = _kind(params)
        tokens = 0.0 if kind != "pretrained" else _number(params, f"{PRETRAINED}tokens")
        seconds = 0.0 if kind != "pretrained" else _number(params, f"{PRETRAINED}train_seconds")
        processes = _number(params, f"{PRETRAINED}processes") or 1.0
        if tokens is None:
            result.skipped.append(
                f"{experiment}/{run.info.run_name} ({run.info.run_id[:8]}): fine-tuned a "
                f"pretrained model but records no {PRETRAINED}tokens (a model exported before "
                "pretraining recorded its tokens, or a run before fine-tuning logged them)"
            )
            continue
        result.runs.append(
            CurveRun(
                experiment=experiment,
                run_id=run.info.run_id,
                kind=kind,
                series=f"{experiment}: {series}" if len(experiments) > 1 else series,
                tokens=tokens,
                hours=None if seconds is None else seconds * processes / 3600.0,
                values={p: float(run.data.metrics[f"{p}_{metric}"]) for p in parts},
                dataset=run.data.tags.get("dataset", ""),
                device=params.get(f"{PRETRAINED}cpu", ""),
                warning=run.data.tags.get(TAG_WARNING, ""),
            )
        )
    return result


def _series_labels(client: MlflowClient, runs: list[Run], keys: Sequence[str]) -> list[str]:
    """A readable label per run from the series keys that vary (a pretraining run is shown by
    its run name, e.g. `pretrain[lr=2e-4]`, not its id)."""
    varying = [k for k in keys if len({_key_value(r, k) for r in runs}) > 1]
    names: dict[str, str] = {}

    def shown(key: str, value: str) -> str:
        if key != f"tag:{TAG_PRETRAIN_RUN}" or not value:
            return f"{key.removeprefix('tag:').split('.')[-1]}={value}" if value else ""
        if value not in names:
            try:
                names[value] = client.get_run(value).info.run_name or value[:8]
            except MlflowException:  # pretrained in another store
                names[value] = f"pretraining {value[:8]}"
        return names[value]

    return [", ".join(p for p in (shown(k, _key_value(r, k)) for k in varying) if p) for r in runs]
