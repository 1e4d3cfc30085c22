"""Fine-tuning runs read from MLflow and placed on a learning curve: each seed run's score
beside the pretraining behind its encoder (the `pretrain.*` params fine-tuning records:
tokens, train_seconds, processes).

A run is one of three kinds: `pretrained` (a point of the curve, at its tokens), `random` (the
same shape with fresh weights: the 0-token point) or `textcnn` (no encoder, the from-scratch
baseline). Aggregation and drawing are `tibnlp.evaluation.curve`'s; this module only reads,
and logs a finished plot to the run it belongs to.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mlflow.entities import Run
from mlflow.exceptions import MlflowException

from tibnlp.errors import ConfigError, TibnlpError
from tibnlp.evaluation.curve import Curve, CurveRun, Kind, aggregate_curve, draw_curve
from tibnlp.fsutil import check_file_path
from tibnlp.tracking.conventions import PRETRAIN, TAG_WARNING
from tibnlp.tracking.reading import metric_value, read_client
from tibnlp.tracking.run_selection import experiment_runs, leaf_runs, split_finished
from tibnlp.tracking.store import default_tracking_uri
from tibnlp.tracking.tracker import Tracker

TAG_PIPELINE = "tibnlp.pipeline"  # set on a pipeline's parent run (its name)
DEFAULT_SERIES_KEYS = ("finetune.head",)  # what tells curves apart when it varies
TEXTCNN_ON_EMBEDDING = "TextCNN on the pretrained embedding"  # the series of such runs


@dataclass
class CurveRuns:
    runs: list[CurveRun]
    skipped: list[str] = field(default_factory=list)  # runs left out, and why, in words


def _number(params: dict[str, str], key: str) -> float | None:
    try:
        value = float(params[key])
    except (KeyError, ValueError):
        return None
    return value if math.isfinite(value) else None


def run_kind(params: dict[str, str]) -> Kind:
    model = params.get("finetune.model", "")
    untrained = params.get("finetune.init") == "random" or model in ("", "none")
    if params.get("finetune.encoder") == "none":
        # TextCNN on a pretrained model's word embedding is a pretrained system (as the result
        # table counts it), not the from-scratch reference: `read_curve_runs` names its curve
        return "textcnn" if untrained else "pretrained"
    return "random" if untrained else "pretrained"


def _key_value(run: Run, key: str) -> str:
    if key.startswith("tag:"):
        return str(run.data.tags.get(key[4:], ""))
    return str(run.data.params.get(key, ""))


def _series(runs: Sequence[Run], keys: Sequence[str]) -> list[str]:
    """A label per run from the series keys whose value varies among `runs` ("" if none)."""
    varying = [k for k in keys if len({_key_value(r, k) for r in runs}) > 1]
    return [
        ", ".join(f"{k.removeprefix('tag:').split('.')[-1]}={_key_value(r, k)}" for k in varying)
        for r in runs
    ]


def read_curve_runs(
    experiments: Sequence[str],
    metric: str = "macro_f1",
    parts: Sequence[str] = ("test", "validation"),
    uri: str = "",
    filter_string: str = "",
    run_ids: Sequence[str] = (),
    series_keys: Sequence[str] = DEFAULT_SERIES_KEYS,
) -> CurveRuns:
    """The finished seed runs of `experiments` that carry `<part>_<metric>` for every part.

    `run_ids`: only these runs (a pipeline's fine-tuning seeds, so that runs left in the store
    by earlier invocations are not counted twice). An experiment with no run carrying the
    metric is an error naming both: a curve drawn without it would silently omit what was
    meant to be compared.
    """
    if not experiments:
        raise TibnlpError("no experiment given", "pass --experiment NAME (repeatable)")
    client = read_client(uri)
    names = [f"{part}_{metric}" for part in parts]
    wanted = set(run_ids)
    found: list[tuple[str, Run]] = []
    result = CurveRuns([])
    for experiment in dict.fromkeys(experiments):  # one named twice: its runs count once
        runs = experiment_runs(client, experiment, filter_string)
        leaves = leaf_runs(runs, lambda r: all(n in r.data.metrics for n in names))
        if wanted:
            leaves = [r for r in leaves if r.info.run_id in wanted]
        leaves, left_out = split_finished(leaves)
        if left_out:
            result.skipped.append(f"{experiment}: runs with the metric not finished ({left_out})")
        if not leaves:
            have = sorted({k for r in runs for k in r.data.metrics if not k.endswith("_std")})
            shown = ", ".join(have[:15]) + (" ..." if len(have) > 15 else "")
            raise TibnlpError(
                f"experiment {experiment!r} has no finished run with metric "
                + " and ".join(repr(n) for n in names)
                + (" among the given runs" if wanted else ""),
                f"its metrics: {shown or 'none'}; choose another with --metric "
                "(macro_f1, weighted_f1, accuracy...) or --part",
            )
        found += [(experiment, r) for r in leaves]
    several = len(experiments) > 1
    labels = _series([r for _, r in found], series_keys)
    for (experiment, run), series in zip(found, labels, strict=True):
        params = run.data.params
        kind = run_kind(params)
        tokens = 0.0 if kind != "pretrained" else _number(params, f"{PRETRAIN}tokens")
        if tokens is None:
            result.skipped.append(
                f"{experiment}/{run.info.run_name} ({run.info.run_id[:8]}): fine-tuned a "
                f"pretrained model but records no {PRETRAIN}tokens (a model exported before "
                "pretraining recorded its tokens, or a run from before fine-tuning logged them)"
            )
            continue
        seconds = 0.0 if kind != "pretrained" else _number(params, f"{PRETRAIN}train_seconds")
        processes = _number(params, f"{PRETRAIN}processes") or 1.0
        if kind == "pretrained" and params.get("finetune.encoder") == "none":
            series = ", ".join(s for s in (series, TEXTCNN_ON_EMBEDDING) if s)
        result.runs.append(
            CurveRun(
                kind=kind,
                tokens=tokens,
                hours=None if seconds is None else seconds * processes / 3600.0,
                values={p: metric_value(run.data.metrics[f"{p}_{metric}"]) for p in parts},
                series=", ".join(s for s in (experiment if several else "", series) if s),
                experiment=experiment,
                run_id=run.info.run_id,
                dataset=run.data.tags.get("dataset", ""),
                warning=run.data.tags.get(TAG_WARNING, ""),
            )
        )
    _one_dataset(result.runs)
    if not any(r.kind == "pretrained" for r in result.runs):
        raise TibnlpError(
            f"no fine-tuning of a pretrained model with {PRETRAIN}tokens in "
            f"{', '.join(map(repr, experiments))}: nothing to draw a curve of",
            "; ".join(result.skipped[:3]) or "fine-tune a model directory from `tibnlp pretrain`",
        )
    return result


def _one_dataset(runs: Sequence[CurveRun]) -> None:
    """A curve is of one dataset: runs of two at one token count were one point, their mean
    over both datasets' seeds (and the published results, which are per dataset, left out)."""
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.dataset] = counts.get(r.dataset, 0) + 1
    if len(counts) > 1:
        shown = ", ".join(f"{name or 'no dataset tag'} {n}" for name, n in sorted(counts.items()))
        first = min(name for name in counts if name) if any(counts) else ""
        raise TibnlpError(
            f"the runs to plot are of {len(counts)} datasets (runs: {shown}): a learning curve "
            "is of one",
            f"plot one at a time: --filter \"tags.dataset = '{first}'\"",
        )


def pipeline_parent(experiment: str, uri: str = "") -> str | None:
    """The latest pipeline parent run of `experiment` (tag `tibnlp.pipeline`, no parent)."""
    client = read_client(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return None
    runs = client.search_runs(
        [exp.experiment_id],
        filter_string=f"tags.`{TAG_PIPELINE}` != ''",
        order_by=["attributes.start_time DESC"],
        max_results=50,
    )
    for run in runs:
        if "mlflow.parentRunId" not in run.data.tags:
            return str(run.info.run_id)
    return None


def run_experiment(run_id: str, uri: str = "") -> str:
    """The experiment name of run `run_id`; a TibnlpError naming --run-id when the store has
    no such run."""
    client = read_client(uri)
    try:
        return str(client.get_experiment(client.get_run(run_id).info.experiment_id).name)
    except MlflowException as exc:
        raise TibnlpError(
            f"no run {run_id!r} in {default_tracking_uri(uri)}", "check --run-id"
        ) from exc


def check_png(output: Path) -> Path:
    """The plot's path: a file name ending in .png (the figure is always a PNG, so another
    suffix would name a file that is not what it says)."""
    output = check_file_path(output)
    if output.suffix.lower() != ".png":
        raise ConfigError(
            f"--output {output}: the plot is a PNG image", "give a file name ending in .png"
        )
    return output


def log_to_run(run_id: str, files: Sequence[Path], uri: str = "", tags: dict | None = None) -> None:
    """Add files (and tags) to an existing run, whatever its state, without changing it (a
    pipeline's running parent, or a finished one)."""
    experiment = run_experiment(run_id, uri)
    with Tracker(experiment, uri=uri, resume_run_id=run_id, keep_status=True) as tracker:
        for file in files:
            tracker.log_artifact(file)
        if tags:
            tracker.set_tags(tags)


def plot_curve(
    experiments: Sequence[str],
    output: Path,
    metric: str = "macro_f1",
    parts: Sequence[str] = ("test", "validation"),
    uri: str = "",
    run_ids: Sequence[str] = (),
    log_run_id: str = "",
    title: str = "",
    filter_string: str = "",
) -> tuple[Curve, list[str]]:
    """Read, aggregate and draw; the PNG (written atomically to `output`) is also logged to
    `log_run_id` when given. Returns the curve and the runs left out (in words). The output
    path and the run are checked first, so a bad one leaves no plot behind."""
    output = check_png(output)
    if log_run_id:
        run_experiment(log_run_id, uri)
    read = read_curve_runs(experiments, metric, parts, uri, filter_string, run_ids)
    curve = aggregate_curve(read.runs, metric, parts)
    draw_curve(curve, output, title or f"learning curve: {', '.join(experiments)}")
    if log_run_id:
        log_to_run(log_run_id, [output], uri)
    return curve, read.skipped
