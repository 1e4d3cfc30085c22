"""A fine-tuned seed's record file (`seed_result.json`) as it is written and read back: its
format outlives the runs that wrote it (whether a record is reused, and how an older one is
brought up to date: `finetune_seeds.py`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tibnlp.evaluation.metrics import Metrics
from tibnlp.evaluation.report import result_json
from tibnlp.fsutil import atomic_write_text
from tibnlp.standard_json import nan_for_nulls

SEED_FILE = "seed_result.json"


@dataclass
class SeedResult:
    seed: int
    best_epoch: int
    epochs_run: int
    metrics: dict[str, Metrics]  # validation, test, test_unseen, advts_original, advts
    directory: Path
    run_id: str | None = None
    record_id: str = ""  # drawn when the seed is trained; kept in its record (TAG_SEED_RECORD)
    data_sha256: str = ""  # `data_sha256` of what it was trained on ("": a record before it)
    # the set it was trained on (`LabelledSet.folder`, "" for a shipped set); None: a record
    # from before it was kept (`require_same_dataset` reads it)
    dataset_folder: str | None = None
    # the extra test sets it was scored on (`extra_sha256`); {}: none, or a record before it
    eval_sha256: dict[str, str] = field(default_factory=dict)


def save_seed(result: SeedResult, fingerprint: str, weights: str = "") -> None:
    """The seed's record (`load_seed` reads it back on a rerun), written atomically."""
    saved = {
        "fingerprint": fingerprint,
        "pretrained_sha256": weights,
        "record_id": result.record_id,
        "data_sha256": result.data_sha256,
        **({} if result.dataset_folder is None else {"dataset_folder": result.dataset_folder}),
        "eval_sha256": result.eval_sha256,
        "seed": result.seed,
        "best_epoch": result.best_epoch,
        "epochs_run": result.epochs_run,
        "metrics": {p: dataclasses.asdict(m) for p, m in result.metrics.items()},
    }
    atomic_write_text(result.directory / SEED_FILE, result_json(saved, indent=1))


def load_seed(
    directory: Path, fingerprint: str, weights: str = "", data_sha256: str = ""
) -> SeedResult | None:
    path = directory / SEED_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return None  # a damaged record: train again
    if data.get("fingerprint") != fingerprint:
        return None
    if data.get("pretrained_sha256", weights) != weights:  # (records before it: not known)
        return None  # same settings and folder name, other weights
    recorded = data.get("data_sha256", "")  # ("": a record before it, not known)
    if recorded and data_sha256 and recorded != data_sha256:
        return None  # as many rows, other texts or labels
    metrics = {p: _metrics_read(m) for p, m in data["metrics"].items()}
    return SeedResult(
        data["seed"],
        data["best_epoch"],
        data["epochs_run"],
        metrics,
        directory,
        record_id=data.get("record_id", ""),
        data_sha256=recorded,
        dataset_folder=data.get("dataset_folder"),
        eval_sha256=dict(data.get("eval_sha256") or {}),
    )


def _metrics_read(saved: dict[str, Any]) -> Metrics:
    """A part's metrics as `save_seed` wrote them, a score not known (null: NaN) as NaN."""
    per_class = {k: nan_for_nulls(v) for k, v in saved.get("per_class", {}).items()}
    return Metrics(**{**saved, "summary": nan_for_nulls(saved["summary"]), "per_class": per_class})
