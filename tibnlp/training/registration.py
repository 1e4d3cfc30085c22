"""A fine-tuning's best seed as a model-registry version (`tracking.register_model`).

The version is the classifier folder of one seed, which `tibnlp predict --model` loads as it
is downloaded, tagged with that seed's own scores, which seed it is and why, and the
fine-tuning run's provenance. (The results folder of all seeds, registered once, was refused
by predict, and its tags were the seeds' means: the scores of no classifier in it.) A pipeline
stage and a standalone `tibnlp finetune` register alike, both from `run_finetune`.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tibnlp.config.tracking import TrackingConfig
from tibnlp.tracking import Tracker
from tibnlp.tracking.conventions import TAG_STAGE

if TYPE_CHECKING:
    from tibnlp.training.finetune import FinetuneResult

# the fine-tuning run's tags a registered version carries: which code, data, vocabulary,
# parent model and (in a pipeline) stage produced it
PROVENANCE_KEYS = (
    "tibnlp.git_commit",
    "tibnlp.data_hash",
    "tibnlp.vocab_hash",
    "tibnlp.parent_model_hash",
    "tibnlp.pretrain_run",
    "tibnlp.stage",
    "tibnlp.variant",
    "tibnlp.model",
    "tibnlp.stage_key",
)
SELECTED_BY = ("validation", "macro_f1")  # what picks the seed a registered version holds
MODEL_ABOUT = (
    "Fine-tuned tibnlp classifiers. Each version is the classifier folder of one seed (the "
    "best on validation macro-F1 of its fine-tuning run; tag tibnlp.seed): download it with "
    "`mlflow artifacts download -u models:/{name}/VERSION -d DIR`, then `tibnlp predict "
    "--model DIR --input TEXTS`. Its tags give its scores and provenance (tibnlp.*)."
)


def _score(seed: Any, part: str, metric: str) -> float:
    value = float(seed.metrics[part].summary.get(metric, float("nan")))
    return float("-inf") if math.isnan(value) else value  # nan: never the best


def best_seed(seeds: list[Any]) -> Any | None:
    """The seed a registered version holds: the best validation macro-F1 (the metric the
    epochs are selected on; the first seed on a tie), not the last one trained. None when
    the result has no seed classifier folders to choose from."""
    part, metric = SELECTED_BY
    usable = [
        s
        for s in seeds
        if part in getattr(s, "metrics", {}) and (Path(s.directory) / "classifier.yaml").is_file()
    ]
    if not usable:
        return None
    return max(usable, key=lambda s: _score(s, part, metric))


def existing_version(tracker: Tracker, name: str, seed: Any) -> str | None:
    """The version of `name` that already holds `seed`'s classifier (the same seed record:
    a rerun of a finished fine-tuning reports its seeds, it does not train them again), or
    None; None too when the store cannot be asked now (offline, or an error)."""
    record = str(getattr(seed, "record_id", "") or "")
    if not record or not tracker.enabled or tracker.offline or "'" in name:
        return None  # (a quote cannot be put in the filter: register, as before)
    query = f"name='{name}' AND tags.`tibnlp.seed_record` = '{record}'"
    try:  # filtered by the store: one version at most comes back, however many there are
        held = tracker.client.search_model_versions(query, max_results=1)
    except Exception:  # (a registry that cannot answer: register, as before)
        return None
    return str(held[0].version) if held else None


def _register_seed(
    tracker: Tracker, name: str, result: Any, best: Any, where: str, pipeline_run: str
) -> None:
    """Register `best`, `result`'s (a `FinetuneResult`) best seed, under `name` from
    `tracker`'s run (the run that fine-tuned it). `where`: the run in words, for the
    version's description."""
    seeds = list(result.seeds)
    part, metric = SELECTED_BY
    tags = {
        f"{p}_{k}": f"{float(v):.6g}"
        for p, m in best.metrics.items()
        for k, v in m.summary.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    scores = ", ".join(f"seed {s.seed}: {_score(s, part, metric):.4f}" for s in seeds)
    tags.update(
        {
            "tibnlp.seed": str(best.seed),
            "tibnlp.selected_by": f"best {part}_{metric} of {len(seeds)} seed(s) ({scores})",
            "tibnlp.system": str(result.system),
            "tibnlp.dataset": str(result.dataset),
            "tibnlp.seed_record": str(getattr(best, "record_id", "") or ""),
            "tibnlp.seed_run": str(getattr(best, "run_id", "") or ""),
            "tibnlp.stage_run": tracker.run_id or "",
            "tibnlp.pipeline_run": pipeline_run,
        }
    )
    tags = {k: v for k, v in tags.items() if v}
    test = result.aggregate.get("test", {}).get(metric)
    spread = (
        f"; the {len(seeds)} seeds' test {metric}: {test[0]:.4f} ± {test[1]:.4f}" if test else ""
    )
    best_test = best.metrics["test"].summary.get(metric) if "test" in best.metrics else None
    description = (
        f"{result.system} on {result.dataset}: seed {best.seed}, the best "
        f"{part} {metric} of seeds {', '.join(str(s.seed) for s in seeds)} ({scores})"
        + (f"; its test {metric} {float(best_test):.4f}" if best_test is not None else "")
        + spread
        + f". {where}; provenance in the tags."
    )
    tracker.register_model(
        Path(best.directory),
        name,
        description=description,
        tags=tags,
        run_tags=PROVENANCE_KEYS,
        model_description=MODEL_ABOUT.format(name=name),
        unique_tag="tibnlp.seed_record",  # (a rerun while offline: `existing_version` is blind)
    )


def register_result(
    parent: Tracker, tracking: TrackingConfig, result: FinetuneResult, in_stage: bool
) -> None:
    """Register `result`'s best seed from `parent` (the stage's run in a pipeline), once: on
    rank 0 only, with tracking on, and not again when a version holds that seed already.
    Notes on `result` what went where, for the stage's report."""
    name = tracking.register_model
    if not parent.enabled:  # (off on every process but rank 0)
        return
    best = best_seed(list(result.seeds))
    if best is None:
        print(
            f"note: no seed has a classifier folder; nothing registered as {name!r}",
            file=sys.stderr,
        )
        return
    held = existing_version(parent, name, best)
    if held is not None:
        result.registered_model, result.registered_seed = name, int(best.seed)
        print(
            f"seed {best.seed}'s classifier is version {held} of model {name!r} already: "
            "not registered again",
            file=sys.stderr,
        )
        return
    if in_stage:
        stage = tracking.tags.get(TAG_STAGE, "finetune")
        where = f"Pipeline stage {stage} (run {parent.run_id})"
        pipeline_run = tracking.parent_run_id
    else:
        where, pipeline_run = f"`tibnlp finetune` run {parent.run_id}", ""
    _register_seed(parent, name, result, best, where, pipeline_run)
    result.registered_model, result.registered_seed = name, int(best.seed)
    print(f"registered seed {best.seed}'s classifier as model {name!r}", file=sys.stderr)
