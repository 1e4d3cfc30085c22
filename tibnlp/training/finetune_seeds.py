"""A fine-tuned seed's record (`seed_result.json`): what lets a rerun report a finished seed
instead of training it again (its scores: `finetune_scores.py`).

The record holds the seed's metrics with their item-level predictions and a fingerprint of
everything that determines its training (settings, classifier shape, split sizes, seed), beside
the hashes of the pretrained weights and of the data; a rerun reuses it only when all match, and
scores an older record without predictions, or with flip rates from before cut texts were left
out of them, again from its saved classifier (the file: `finetune_record.py`). The extra test
sets (`finetune.eval_also`) are no part of the training: the record hashes each it was scored
on apart (`eval_sha256`), and one added to the command, or changed since, is scored from the
saved classifier. It names the set's folder too: another set of the same name is refused the
output (`require_same_dataset`). Apart from the run (`finetune.py`) because the record's format
and key outlive it: a change here decides whether seeds trained before are still reused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from tibnlp.config import Config, to_dict
from tibnlp.config.finetune import FinetuneConfig
from tibnlp.config.identity import output_settings
from tibnlp.data.labelled import LabelledSet
from tibnlp.errors import DataError
from tibnlp.evaluation.report import RESULTS_MD, result_json
from tibnlp.evaluation.result_loader import RESULTS_JSON
from tibnlp.fsutil import atomic_write_text
from tibnlp.models.classifier_io import load_classifier
from tibnlp.training.finetune_record import SEED_FILE, SeedResult, load_seed, save_seed
from tibnlp.training.finetune_scores import EXTRA_PARTS, encoded_split, score_extra, score_seed
from tibnlp.training.finetune_setup import Setup, ids_sha256

SEED_DIR_PREFIX = "seed-"  # a seed's folder in the run's output: seed-1, seed-2...
# why a record kept without item-level predictions is not reported (`rescore` gave None)
RESCORE_FAILED = (
    "was kept without item-level predictions, and its classifier is missing or no longer "
    "gives the recorded scores"
)
# why a record with flip rates from before cut texts were left out is not reported
OLD_FLIPS_FAILED = (
    "holds flip rates that counted texts cut at the read length as not flipped, and its "
    "classifier is missing or no longer gives the recorded scores"
)
# what a reported seed whose old flip rates were scored again says (`say_resume`)
FLIPS_RESCORED = "flip rates scored again over the texts read with the suffix"
# why a finished seed lacking an extra set's scores is not reported (`add_extra_scores`: None)
EXTRA_FAILED = "has no scores on the --eval-also set, and its classifier is missing or damaged"


def resumed_seed(
    directory: Path,
    setup: Setup,
    cfg: Config,
    seed: int,
    unseen: list[int],
    advts: LabelledSet | None,
    fingerprint: str,
    evals: dict[str, str],
) -> SeedResult | None:
    """The seed as an earlier run finished it with this training (`fingerprint`), scored on
    what this run asks (`evals`: `extra_sha256`), said on stderr; None: train it. Rank 0's
    alone (it reads and writes the seed's folder)."""
    weights = setup.pretrained_sha256
    upgrade_record(directory, setup, cfg, seed, advts, fingerprint, evals)
    done = load_seed(directory, fingerprint, weights, setup.data_sha256)
    why, scored = "", extras_to_score(done, evals) if done is not None else []
    old_flips = done is not None and lacks_flip_excluded(done)
    if done is not None and (lacks_predictions(done) or old_flips):
        done = rescore(done, setup, cfg.finetune, unseen, advts, evals, fingerprint, weights)
        why = "" if done is not None else OLD_FLIPS_FAILED if old_flips else RESCORE_FAILED
        scored = [FLIPS_RESCORED] if old_flips else []
    elif done is not None and scored:
        done = add_extra_scores(done, setup, cfg.finetune, advts, evals, fingerprint, weights)
        why = "" if done is not None else EXTRA_FAILED
    say_resume(seed, directory, done is not None, why, scored)
    if done is None:
        if (directory / SEED_FILE).is_file():
            drop_stale_results(directory.parent)
        return None
    if not done.record_id:  # from before record ids: one now
        done.record_id = uuid.uuid4().hex
        save_seed(done, fingerprint, weights)
    # an earlier command's extra sets stay in the record, not in this run's result: every
    # seed of it reports the same parts
    dropped = {p for name, parts in EXTRA_PARTS.items() if name not in evals for p in parts}
    return dataclasses.replace(
        done, metrics={p: m for p, m in done.metrics.items() if p not in dropped}
    )


def say_resume(
    seed: int, directory: Path, reused: bool, why: str = "", scored: Sequence[str] = ()
) -> None:
    """A rerun says which seeds it reports from their records and which it trains again
    (`why`: the reason, when it is not that the record is of other settings): without it a
    resumed command and a fresh one print the same, and an overwrite is silent. `scored`:
    the extra sets a reported seed was scored on now, from its saved classifier (or
    `FLIPS_RESCORED`)."""
    record = directory / SEED_FILE
    if reused:
        message = f"seed {seed}: finished earlier ({record}): reported, not retrained"
        if FLIPS_RESCORED in scored:
            message += f"; {FLIPS_RESCORED} from its saved classifier"
        elif scored:
            message += f"; scored on {', '.join(scored)} from its saved classifier"
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


def extra_sha256(setup: Setup, advts: LabelledSet | None) -> dict[str, str]:
    """The extra test sets a seed is scored on (`finetune.eval_also`), each hashed as the
    classifier reads it; out of the seed's key: one added or changed is scored again from the
    saved classifier (`add_extra_scores`), not trained for."""
    return {} if advts is None else {"advts": ids_sha256(_advts_parts(setup, advts))}


def _advts_parts(setup: Setup, advts: LabelledSet) -> list[tuple[str, list[list[int]], list[int]]]:
    """AdvTS's splits as `ids_sha256` hashes them (names as records before `eval_sha256` did)."""
    parts = [(f"advts_{p}", encoded_split(setup, advts, p), advts.targets(p)) for p in advts.splits]
    return sorted(parts, key=lambda part: part[0])


def upgrade_record(
    directory: Path,
    setup: Setup,
    cfg: Config,
    seed: int,
    advts: LabelledSet | None,
    fingerprint: str,
    evals: dict[str, str],
) -> None:
    """A record from before `eval_sha256` (AdvTS in its fingerprint and data hash), written
    again in today's form when it holds this run's training, data and AdvTS: its seed is
    reported, not trained again. (One made without AdvTS has today's key already; one made
    with it is known only to a run that reads AdvTS.)"""
    path = directory / SEED_FILE
    record = _read_json(path)
    if advts is None or not record or "eval_sha256" in record:
        return
    if record.get("fingerprint") != seed_fingerprint(setup, cfg, seed, True):
        return
    recorded = record.get("data_sha256", "")  # ("": a record before it: data not known)
    if recorded and recorded != ids_sha256(_advts_parts(setup, advts), setup.data_sha256):
        return  # other data: trained again, as any record of other data
    record["fingerprint"] = fingerprint
    record["data_sha256"] = setup.data_sha256 if recorded else ""
    record["eval_sha256"] = evals if recorded else {}  # (not known: scored again)
    atomic_write_text(path, result_json(record, indent=1))


def seed_fingerprint(setup: Setup, cfg: Config, seed: int, with_extra: bool = False) -> str:
    """Everything that determines a seed's training (not where it is written, nor the extra
    test sets it is scored on: `extra_sha256`). `with_extra`: the key of a record from
    before, which held them (`upgrade_record`)."""
    # settings added later enter only when set (ADDED_WHEN_SET): earlier seeds keep their key;
    # engine settings that change results (precision, ZeRO) only when not the defaults;
    # eval_also at its default, so a seed keeps the key it had when scored on no extra set
    pinned = () if with_extra else ("finetune.eval_also",)
    hashed = output_settings(to_dict(cfg), ("finetune", "engine"), pinned)
    settings = {k: v for k, v in hashed.pop("finetune").items() if k not in ("seeds", "output")}
    meta = to_dict(setup.meta)
    # pooling as resolved (auto -> cls or cls_max for this encoder): seeds trained when cls was
    # the default keep their key wherever auto reads as cls
    settings["pooling"] = meta["head"]["pooling"]
    if not meta["head"]["static_size"]:  # added later: seeds trained before keep their key
        del meta["head"]["static_size"]
    # where predict finds a record's text and label: the data hash holds what was read
    for name in ("text_field", "label_field"):
        del meta[name]
    key: dict[str, Any] = {
        "finetune": settings,
        **hashed,
        "meta": meta,
        "sizes": {s: len(v) for s, v in setup.ids.items()},
        "seed": seed,
        "advts": with_extra and "advts" in cfg.finetune.eval_also,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def extras_to_score(done: SeedResult, evals: dict[str, str]) -> list[str]:
    """The extra sets asked for (`evals`) a finished seed has no scores on: not scored when
    it was, or scored on another version of the set."""
    return [
        name
        for name, sha in evals.items()
        if done.eval_sha256.get(name) != sha or not EXTRA_PARTS[name].keys() <= done.metrics.keys()
    ]


def add_extra_scores(
    done: SeedResult,
    setup: Setup,
    ft: FinetuneConfig,
    advts: LabelledSet | None,
    evals: dict[str, str],
    fingerprint: str,
    weights: str = "",
) -> SeedResult | None:
    """A finished seed scored on the extra sets it lacks (`extras_to_score`), from its saved
    classifier, and its record written again (atomically); None (train the seed again) when
    the classifier cannot be read."""
    model = _saved_classifier(done)
    if model is None:
        return None
    metrics = {**done.metrics, **score_extra(setup, ft, model, advts)}
    scored = dataclasses.replace(done, metrics=metrics, eval_sha256={**done.eval_sha256, **evals})
    save_seed(scored, fingerprint, weights)
    return scored


def _saved_classifier(done: SeedResult) -> torch.nn.Module | None:
    """The classifier a finished seed saved; None when it is missing or cannot be read."""
    try:
        model, _ = load_classifier(done.directory)
    except (OSError, ValueError, KeyError, DataError):
        return None
    return model


def lacks_predictions(done: SeedResult) -> bool:
    """A seed record written before item-level predictions were kept."""
    return any(m.count and not m.predictions for m in done.metrics.values())


def lacks_flip_excluded(done: SeedResult) -> bool:
    """A seed record written before a flip rate left out the texts whose suffix is cut at the
    read length (`*_flip_excluded`): its rate counted them as not flipped, and averaged with
    today's rates it would make a mean of two measures."""
    return any(
        key.removesuffix("_rate") + "_excluded" not in m.summary
        for m in done.metrics.values()
        for key in m.summary
        if key.endswith("_flip_rate")
    )


def rescore(
    done: SeedResult,
    setup: Setup,
    ft: FinetuneConfig,
    unseen: list[int],
    advts: LabelledSet | None,
    evals: dict[str, str],
    fingerprint: str,
    weights: str = "",
) -> SeedResult | None:
    """An older finished seed with its predictions added (and its flip rates as today's
    leave out cut texts), scored again from its saved classifier (inference is
    deterministic), so `finetune compare` can pair it; None (train
    the seed again) when the classifier is missing or does not give the recorded scores.
    (An extra set's parts not asked for now, or scored on another version of it, are not
    compared, and only those asked for are kept.)"""
    model = _saved_classifier(done)
    if model is None:
        return None
    metrics = score_seed(setup, ft, model, unseen, advts)
    other = set(extras_to_score(done, evals))
    other |= {name for name in EXTRA_PARTS if name not in evals}
    skipped = {part for name in other for part in EXTRA_PARTS[name]}
    for part, old in done.metrics.items():
        new = metrics.get(part)
        if part in skipped:
            continue
        if new is None or abs(new.summary["macro_f1"] - old.summary["macro_f1"]) > 1e-9:
            return None
    rescored = dataclasses.replace(done, metrics=metrics, eval_sha256=dict(evals))
    save_seed(rescored, fingerprint, weights)
    return rescored
