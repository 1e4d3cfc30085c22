"""A fine-tuned seed's scores and its record (`seed_result.json`): what lets a rerun report a
finished seed instead of training it again.

The record holds the seed's metrics with their item-level predictions and a fingerprint of
everything that determines them (settings, classifier shape, split sizes, seed), beside the
hashes of the pretrained weights and of the data; a rerun reuses it only when all match, and
scores an older record without predictions again from its saved classifier. It names the set's
folder too: another set of the same name is refused the output (`require_same_dataset`). Apart
from the run (`finetune.py`) because the record's format and key outlive it: a change here
decides whether seeds trained before are still reused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tibnlp.config import Config, to_dict
from tibnlp.config.finetune import FinetuneConfig
from tibnlp.config.identity import output_settings
from tibnlp.data.collate import encode_texts
from tibnlp.data.labelled import LabelledSet, model_text
from tibnlp.errors import DataError
from tibnlp.evaluation.metrics import Metrics, compute_metrics
from tibnlp.evaluation.predict import predict_proba
from tibnlp.evaluation.report import RESULTS_JSON, RESULTS_MD, result_json
from tibnlp.evaluation.robustness import suffix_flip_rates
from tibnlp.fsutil import atomic_write_text
from tibnlp.models.classifier_io import load_classifier, read_length
from tibnlp.training.finetune_setup import Setup, ids_sha256, texts

SEED_FILE = "seed_result.json"
SEED_DIR_PREFIX = "seed-"  # a seed's folder in the run's output: seed-1, seed-2...
# why a record kept without item-level predictions is not reported (`rescore` gave None)
RESCORE_FAILED = (
    "was kept without item-level predictions, and its classifier is missing or no longer "
    "gives the recorded scores"
)


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


def say_resume(seed: int, directory: Path, reused: bool, why: str = "") -> None:
    """A rerun says which seeds it reports from their records and which it trains again
    (`why`: the reason, when it is not that the record is of other settings): without it a
    resumed command and a fresh one print the same, and an overwrite is silent."""
    record = directory / SEED_FILE
    if reused:
        message = f"seed {seed}: finished earlier ({record}): reported, not retrained"
    elif record.is_file():
        message = (
            f"seed {seed}: {record} {why or 'is from other settings, weights or data'}: "
            "training it again (its folder is replaced)"
        )
    else:
        return
    print(message, file=sys.stderr, flush=True)


def drop_stale_results(output: Path) -> None:
    """Remove the results.json and results.md of an earlier run in `output` once one of its
    seeds is trained again: they give that seed's old scores, and a run stopped before its
    own results are written would leave them beside the new classifier (`finetune report`
    showing the old scores and recipe as this folder's result)."""
    for name in (RESULTS_JSON, RESULTS_MD):
        (output / name).unlink(missing_ok=True)


def require_same_dataset(output: Path, data: LabelledSet) -> None:
    """Refuse to fine-tune into `output` when its results are of another set of the same name:
    a folder set is named by its folder, so ./tusa and the shipped tusa, or a/mine and b/mine,
    share `runs/finetune/NAME`, and the second run would replace the first one's seeds.
    Read from every finished seed's record as well as from results.json (written last): a run
    stopped after its first seed left no results.json, and the other set's run went on to
    replace or report those seeds."""
    others = sorted(_recorded_datasets(output) - {data.folder})
    if not others:
        return

    def which(folder: str) -> str:
        return f"the folder {folder}" if folder else f"the shipped set '{data.name}'"

    raise DataError(
        f"{output} holds the results of {which(others[0])}; this run reads {which(data.folder)} "
        "and would replace them",
        "give this run its own output (--set finetune.output=DIR), or move those results away "
        "(if it is the same set moved to another folder, remove them)",
    )


def _recorded_datasets(output: Path) -> set[str]:
    """The sets (`LabelledSet.folder`, "" for a shipped one) whose results `output` holds:
    as its results.json notes name it, and as each finished seed's record does (a record from
    before they were kept, or a damaged file, names none)."""
    found: set[str] = set()
    notes = _read_json(output / RESULTS_JSON).get("notes")
    if isinstance(notes, dict):
        found.add(str(notes.get("dataset_folder") or ""))
    for record in sorted(output.glob(f"{SEED_DIR_PREFIX}*/{SEED_FILE}")):
        folder = _read_json(record).get("dataset_folder")
        if isinstance(folder, str):
            found.add(folder)
    return found


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object file; {} when missing or damaged (nothing to keep)."""
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def seed_data_sha256(setup: Setup, advts: LabelledSet | None) -> str:
    """`Setup.data_sha256`, extended by the AdvTS parts when the seed is scored on them."""
    if advts is None:
        return setup.data_sha256
    parts = [(f"advts_{p}", _encoded(setup, advts, p), advts.targets(p)) for p in advts.splits]
    return ids_sha256(sorted(parts, key=lambda part: part[0]), setup.data_sha256)


def _encoded(setup: Setup, data: LabelledSet, split: str) -> list[list[int]]:
    """A split of another set (AdvTS) as the classifier reads it."""
    return encode_texts(
        setup.vocab, texts(data, split, setup.meta.text_form), read_length(setup.meta)
    )


def seed_fingerprint(setup: Setup, cfg: Config, seed: int, advts: bool) -> str:
    """Everything that determines a seed's result (not where it is written)."""
    # settings added later enter only when set (ADDED_WHEN_SET): earlier seeds keep their key;
    # engine settings that change results (precision, ZeRO) only when not the defaults
    hashed = output_settings(to_dict(cfg), ("finetune", "engine"))
    settings = {k: v for k, v in hashed.pop("finetune").items() if k not in ("seeds", "output")}
    meta = to_dict(setup.meta)
    # pooling as resolved (auto -> cls or cls_max for this encoder): seeds trained when cls was
    # the default keep their key wherever auto reads as cls
    settings["pooling"] = meta["head"]["pooling"]
    if not meta["head"]["static_size"]:  # added later: seeds trained before keep their key
        del meta["head"]["static_size"]
    key: dict[str, Any] = {
        "finetune": settings,
        **hashed,
        "meta": meta,
        "sizes": {s: len(v) for s, v in setup.ids.items()},
        "seed": seed,
        "advts": advts,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def score_seed(
    setup: Setup,
    ft: FinetuneConfig,
    model: torch.nn.Module,
    unseen: list[int],
    advts: LabelledSet | None,
    validation: Metrics | None = None,
) -> dict[str, Metrics]:
    """Every part's metrics of a trained classifier; `validation` as scored when its epoch
    was selected (None: scored here)."""
    data, ids, labels = setup.data, setup.ids, setup.data.labels

    def predict(x: Sequence[Sequence[int]]) -> list[int]:
        probs = predict_proba(model, x, ft.eval_batch_size, setup.vocab.pad_id, ft.eval_routing)
        return probs.argmax(1).tolist()

    def evaluate(x: Sequence[Sequence[int]], y: Sequence[int]) -> Metrics:
        return compute_metrics(y, predict(x), labels)

    def predict_raw(texts: list[str]) -> list[int]:  # as `tibnlp predict` receives them
        read, join = read_length(setup.meta), setup.meta.join_spaced_syllables
        return predict(
            encode_texts(setup.vocab, [model_text(t, ft.text_form, join) for t in texts], read)
        )

    y_test = data.targets("test")
    test_pred = predict(ids["test"])  # scored after training only, never to select
    test = compute_metrics(y_test, test_pred, labels)
    test.summary.update(suffix_flip_rates(predict_raw, data.texts("test"), test_pred))
    if validation is None:
        validation = evaluate(ids["validation"], data.targets("validation"))
    metrics = {
        "validation": validation,
        "test": test,
        "test_unseen": compute_metrics(
            [y_test[i] for i in unseen], [test_pred[i] for i in unseen], labels
        ),
    }
    if advts is not None:
        for part, key in (("original", "advts_original"), ("adversarial", "advts")):
            metrics[key] = evaluate(_encoded(setup, advts, part), advts.targets(part))
    return metrics


def lacks_predictions(done: SeedResult) -> bool:
    """A seed record written before item-level predictions were kept."""
    return any(m.count and not m.predictions for m in done.metrics.values())


def rescore(
    done: SeedResult,
    setup: Setup,
    ft: FinetuneConfig,
    unseen: list[int],
    advts: LabelledSet | None,
    fingerprint: str,
    weights: str = "",
) -> SeedResult | None:
    """An older finished seed with its predictions added, scored again from its saved
    classifier (inference is deterministic), so `finetune compare` can pair it; None (train
    the seed again) when the classifier is missing or does not give the recorded scores."""
    try:
        model, _ = load_classifier(done.directory)
    except (OSError, ValueError, KeyError, DataError):
        return None
    metrics = score_seed(setup, ft, model, unseen, advts)
    for part, old in done.metrics.items():
        new = metrics.get(part)
        if new is None or abs(new.summary["macro_f1"] - old.summary["macro_f1"]) > 1e-9:
            return None
    rescored = dataclasses.replace(done, metrics=metrics)
    save_seed(rescored, fingerprint, weights)
    return rescored


def save_seed(result: SeedResult, fingerprint: str, weights: str = "") -> None:
    """The seed's record (`load_seed` reads it back on a rerun), written atomically."""
    saved = {
        "fingerprint": fingerprint,
        "pretrained_sha256": weights,
        "record_id": result.record_id,
        "data_sha256": result.data_sha256,
        **({} if result.dataset_folder is None else {"dataset_folder": result.dataset_folder}),
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
    metrics = {p: Metrics(**m) for p, m in data["metrics"].items()}
    return SeedResult(
        data["seed"],
        data["best_epoch"],
        data["epochs_run"],
        metrics,
        directory,
        record_id=data.get("record_id", ""),
        data_sha256=recorded,
        dataset_folder=data.get("dataset_folder"),
    )
