"""Which of an experiment's runs a comparison or a curve reads: every page of them, the
finished ones (the others said in words), and each seed once.

A fine-tuning stage over its seed runs is their aggregate, and a resumed fine-tuning reports
its finished seeds again in new runs: read as they are, both would count a seed twice.
Grouping and aggregating the runs read is `compare`'s job.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mlflow.entities import Metric, Param, Run, RunData, RunTag
from mlflow.exceptions import MlflowException
from mlflow.store.entities.paged_list import PagedList
from mlflow.tracking import MlflowClient

from tibnlp.errors import ConfigError, TibnlpError
from tibnlp.tracking.conventions import TAG_SEED_RECORD


def experiment_runs(client: MlflowClient, experiment: str, filter_string: str = "") -> list[Run]:
    """Every run of `experiment` (all pages), whatever its status; a clear error naming the
    known experiments when there is no such experiment."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        names = sorted(e.name for e in client.search_experiments())
        raise TibnlpError(
            f"no experiment named {experiment!r} in {client.tracking_uri}",
            f"known experiments: {', '.join(names) or 'none'}",
        )
    if exp.lifecycle_stage == "deleted":  # its runs are in the trash too: say so, not "none"
        raise TibnlpError(
            f"experiment {experiment!r} in {client.tracking_uri} is deleted",
            f"restore it: MLFLOW_TRACKING_URI={client.tracking_uri} mlflow experiments restore "
            f"-x {exp.experiment_id}",
        )
    runs: list[Run] = []
    token = None
    while True:
        page = _search_page(client, exp.experiment_id, filter_string, token)
        runs += list(page)
        token = page.token
        if not token:
            break
    return runs


def split_finished(runs: Sequence[Run]) -> tuple[list[Run], str]:
    """The finished runs, and the others in words ("1 FAILED, 1 RUNNING"; "" when none): a
    failed, killed or running seed left out of a mean without a word reads as fewer seeds."""
    finished = [r for r in runs if r.info.status == "FINISHED"]
    counts: dict[str, int] = {}
    for r in runs:
        if r.info.status != "FINISHED":
            counts[r.info.status] = counts.get(r.info.status, 0) + 1
    return finished, ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))


def _search_page(
    client: MlflowClient, experiment_id: str, filter_string: str, token: str | None
) -> PagedList[Run]:
    """One page of runs; a filter MLflow cannot parse is a ConfigError naming --filter."""
    try:
        return client.search_runs(
            [experiment_id], filter_string=filter_string, max_results=1000, page_token=token
        )
    except MlflowException as exc:
        if not filter_string or exc.error_code != "INVALID_PARAMETER_VALUE":
            raise
        raise ConfigError(
            f"--filter {filter_string!r} is not a valid MLflow run filter ({exc.message})",
            "write it as MLflow's search syntax, e.g. \"params.finetune.task = 'title'\" or "
            '"metrics.test_accuracy > 0.5" (values in single quotes, keys with dots as is)',
        ) from exc


def leaf_runs(runs: Sequence[Run], matching: Callable[[Run], Any]) -> list[Run]:
    """The runs carrying the metrics (`matching(run)` true), less those whose nested runs carry
    them too: such a run is their aggregate (a stage over seeds), so the leaves (the seeds) are
    counted, not the aggregate a second time, nor its own `*_mean`/`*_std` columns."""
    kept = [r for r in runs if matching(r)]
    parents = {r.data.tags.get("mlflow.parentRunId") for r in kept}
    leaves = [r for r in kept if r.info.run_id not in parents]
    # a resumed fine-tuning re-reports its finished seeds in new runs (tag `resumed`): under
    # the same stage run in a pipeline (one seed of one stage is one run, the latest), under a
    # new parent run when `tibnlp finetune` is run again (one seed record is one run, the
    # latest, with the scores only earlier runs logged; records trained before the tag are
    # told apart by their parent only)
    leaves = _latest(leaves, lambda r: _pair(r, "mlflow.parentRunId", "seed"))
    return _latest(leaves, lambda r: _pair(r, TAG_SEED_RECORD))


def _pair(run: Run, *tags: str) -> tuple[str, ...] | None:
    values = tuple(run.data.tags.get(t) or "" for t in tags)
    return values if all(values) else None


def _latest(runs: list[Run], key: Callable[[Run], Any]) -> list[Run]:
    """`runs` less those a later run with the same `key` replaces (a None key: none does).

    The run kept holds, beside its own metrics, those of the runs it replaces that it did not
    log: a rerun without `--eval-also advts` reports the seed's own parts only, while its
    record still holds the AdvTS scores an earlier run logged (and each run's metrics stay
    those of its parent's result). A metric both logged is the later run's (a record scored
    again)."""
    groups: dict[Any, list[Run]] = {}
    for r in sorted(runs, key=lambda r: r.info.start_time or 0):
        groups.setdefault(key(r) or r.info.run_id, []).append(r)
    kept = {g[-1].info.run_id: _merged(g) if len(g) > 1 else g[-1] for g in groups.values()}
    return [kept[r.info.run_id] for r in runs if r.info.run_id in kept]


def _merged(runs: Sequence[Run]) -> Run:
    """The last of `runs` with the metrics of them all, a later run's value first."""
    metrics: dict[str, float] = {}
    for r in runs:
        metrics.update(r.data.metrics)
    last = runs[-1]
    data = RunData(
        metrics=[Metric(k, v, 0, 0) for k, v in metrics.items()],
        params=[Param(k, v) for k, v in last.data.params.items()],
        tags=[RunTag(k, v) for k, v in last.data.tags.items()],
    )
    return Run(last.info, data)
