"""Fine-tuning a classifier: seeds, metrics, seed records and MLflow, on the `Setup` that
`finetune_setup.prepare` resolves (data, encoder, vocabulary).

One parent MLflow run per command, one child run per seed. Each finished seed leaves its
classifier directory and `seed_result.json` (with a fingerprint of everything that determines
the result), so rerunning the same command resumes: finished seeds are reported, not retrained.
Training runs on the one loop (`loop.TrainLoop`); what is specific to classification is
in `classification.py`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tibnlp.config import Config, to_dict
from tibnlp.config.finetune import FinetuneConfig
from tibnlp.config.identity import output_settings
from tibnlp.data.collate import SampledSegmentation, encode_texts
from tibnlp.data.tasks import LabelledSet, load_advts, model_text
from tibnlp.errors import DataError
from tibnlp.evaluation.leakage import unseen_indices
from tibnlp.evaluation.metrics import Metrics, aggregate, compute_metrics, majority_macro_f1
from tibnlp.evaluation.plots import confusion_png
from tibnlp.evaluation.predict import predict_proba
from tibnlp.evaluation.report import RESULTS_JSON, RESULTS_MD, result_json, write_results
from tibnlp.evaluation.robustness import suffix_flip_rates
from tibnlp.fsutil import atomic_write_text
from tibnlp.models.classifier_io import (
    ClassifierMeta,
    build_classifier,
    load_classifier,
    read_length,
    save_classifier,
)
from tibnlp.models.long_documents.reading import inner_encoder
from tibnlp.tracking import PrefixedRun, Tracker, provenance_tags, tracker_from_config
from tibnlp.tracking.conventions import TAG_PRETRAIN_RUN, TAG_SEED_RECORD, pretrain_params
from tibnlp.training.aux_mlm import MlmHead, TokenMasker
from tibnlp.training.classification import probe_recipe, set_seed, train_one_seed
from tibnlp.training.finetune_notes import pretraining_of, warn_if_majority
from tibnlp.training.finetune_setup import (
    Setup,
    classes_absent,
    classes_left_out,
    ids_sha256,
    load_task_data,
    prepare,
    texts,
)
from tibnlp.training.long_documents import prepare_reader
from tibnlp.training.soup_run import cook_soup, fine_tune_copies

SEED_FILE = "seed_result.json"
# why a record kept without item-level predictions is not reported (`_rescore` gave None)
RESCORE_FAILED = (
    "was kept without item-level predictions, and its classifier is missing or no longer "
    "gives the recorded scores"
)
ADVTS_TARGETS = {"tncc-title": "tncc", "tusa": "tusa"}


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


@dataclass
class FinetuneResult:
    system: str  # e.g. "albert-pretrained(tiny)+cnn"
    dataset: str
    seeds: list[SeedResult]
    aggregate: dict[str, dict[str, tuple[float, float]]]  # part -> metric -> (mean, std)
    notes: dict[str, Any] = field(default_factory=dict)
    output: Path = Path()


def recipe(ft: FinetuneConfig, meta: ClassifierMeta | None = None) -> dict[str, Any]:
    """The training settings a recipe search varies, as reports show them. `dropout` is the
    head's; with a transformer encoder (`meta`), its own dropout as fine-tuning runs it too
    (the model's unless `finetune.encoder_dropout` is set: 0 for a model pretrained without)."""
    encoder: dict[str, float] = {}
    if meta is not None and meta.encoder == "albert":
        encoder = {
            "encoder_dropout": meta.model.dropout,
            "attention_dropout": meta.model.attention_dropout,
        }
    return {
        "lr": ft.optimizer.lr,
        "head_lr": ft.head_lr or ft.optimizer.lr,
        "embedding_lr": ft.embedding_lr or ft.optimizer.lr,
        "epochs": ft.epochs,
        "patience": ft.patience,
        "batch_size": ft.batch_size,
        "warmup_ratio": ft.warmup_ratio,
        "dropout": ft.dropout,
        **encoder,
        "layer_decay": ft.layer_decay,
        "mlm_weight": ft.mlm_weight,
        "mlm_prob": ft.mlm_prob,
        "class_balance": ft.class_balance,
        "adversarial": ft.adversarial,
        "subword_alpha": ft.subword_alpha,
        "subword_nbest": ft.subword_nbest,
    }


def _untrained(ft: FinetuneConfig) -> str:
    if ft.encoder == "none":
        return "none (TextCNN on piece embeddings from scratch)"
    if ft.model_dir:
        return f"random init with the shape of {ft.model_dir}"
    return "random init (the config's model section)"


def run_finetune(cfg: Config, dataset: str, task: str = "title") -> FinetuneResult:
    """Fine-tune one system on one dataset for every seed; log, save, aggregate, report."""
    ft = cfg.finetune
    # the batch split over the processes before the task is read and tokenised (the engine
    # would refuse it only at the first seed's training)
    from tibnlp.training.engine import accumulation_steps, planned_world_size

    accumulation_steps(ft.batch_size, 0, planned_world_size(), "finetune.batch_size")
    if cfg.engine.threads:
        torch.set_num_threads(cfg.engine.threads)
    data = load_task_data(dataset, task)
    setup = prepare(cfg, data)
    output = Path(ft.output) / data.name / setup.system.replace("/", "_")
    unseen = unseen_indices(setup.train_texts, texts(data, "test", ft.text_form))
    advts = _advts(setup, ft.eval_also)
    spaces = "syllables joined with U+0F0B" if data.join_spaced_syllables else "words removed"
    notes = {
        "input_form": f"{ft.text_form} (spaces between {spaces}, NFC"
        + (", closing shads and tshegs removed)" if ft.text_form == "tsheg-trimmed" else ")"),
        "recipe": recipe(ft, setup.meta),
        "stored_form": data.source_form,
        "max_len": setup.meta.max_len,
        "sizes": {s: len(v) for s, v in setup.ids.items()},
        "test_unseen": f"{len(unseen)} of {len(data.splits['test'])} test texts not in train",
        "vocab": str(setup.vocab_dir),
        "vocab_sha256": setup.vocab.sha256,
        "model": setup.meta.source_model or _untrained(ft),
    }
    tags = {"stage": "finetune", "dataset": data.name, "system": setup.system}
    # a validation macro-F1 at this level is a classifier collapsed onto one class
    majority = majority_macro_f1(data.targets("validation"), len(data.labels))
    notes["validation_majority_macro_f1"] = majority
    notes["cut_at_read_length"] = {"read_length": read_length(setup.meta), **setup.cut}
    if unread := ft.unread_settings():
        notes["unread_settings"] = unread
        print(
            f"note: {', '.join(unread)} set, but long_document={ft.long_document} does not read "
            "them (global_memory and memory_selection: memory only; document_max_len: "
            "segments and memory)",
            file=sys.stderr,
            flush=True,
        )
    if absent := classes_absent(data):
        notes["classes_absent"] = absent
        print(f"note: {absent}", file=sys.stderr, flush=True)
    if left_out := classes_left_out(data, ft.limit_train):
        notes["limit_train"] = left_out
        print(f"warning: {left_out}", file=sys.stderr, flush=True)
    for split, c in setup.cut.items():
        if c["texts"]:  # a document cap (or the window) drops text: say how much, once
            print(
                f"note: {c['texts']} of {len(setup.ids[split])} {split} texts are longer than "
                f"the read length ({read_length(setup.meta)} tokens); {c['tokens_dropped']} "
                "tokens were cut off and not read",
                file=sys.stderr,
                flush=True,
            )
    # the pretraining behind the number (step, tokens, seconds...): what a learning curve plots
    extra = pretraining_of(ft)
    if setup.meta.source_model:
        notes["pretraining"] = extra
    budget = pretrain_params(extra, ft.random_init)
    if extra.get("mlflow_run_id"):  # also for the baselines: whose shape or vocabulary they use
        tags[TAG_PRETRAIN_RUN] = str(extra["mlflow_run_id"])
    tracking = cfg.tracking
    seeds: list[SeedResult] = []
    # the encoder actually loaded (from the model directory), not the config's model section
    described = {k: v for k, v in to_dict(cfg).items() if k != "tracking"}
    described["model"] = to_dict(setup.meta.model)
    in_stage = bool(tracking.run_id)  # a pipeline stage's run: it holds the config already
    with tracker_from_config(tracking, f"{data.name} {setup.system}", tags) as parent:
        if not in_stage:
            parent.log_params(to_dict(cfg.finetune))
        parent.log_params({"model_config": to_dict(setup.meta.model), **budget})
        parent.set_tags({k: str(v) for k, v in notes.items()})
        parent.log_metrics(
            {f"cut_{s}_{k}": float(n) for s, c in setup.cut.items() for k, n in c.items()}
        )
        parent.set_tags(
            provenance_tags(vocab=setup.vocab_dir, parent_model=setup.meta.source_model)
        )
        for seed in ft.seeds:
            # seeds are the leaves `runs compare` groups: they carry the config and model tags
            with parent.child(
                f"seed {seed}", tags={**tracking.tags, **tags, "seed": str(seed)}
            ) as run:
                run.log_params({**described, **budget})
                result = _run_seed(setup, cfg, seed, output / f"seed-{seed}", unseen, advts, run)
                score = result.metrics["validation"]["macro_f1"]
                warn_if_majority(run, setup.system, seed, score, majority)
                result.run_id = run.run_id
                seeds.append(result)
        parts = seeds[0].metrics.keys()
        agg = {p: aggregate([s.metrics[p].summary for s in seeds]) for p in parts}
        for part, values in agg.items():
            parent.log_metrics({f"{part}_{k}_mean": m for k, (m, _) in values.items()})
            parent.log_metrics({f"{part}_{k}_std": s for k, (_, s) in values.items()})
        final = FinetuneResult(setup.system, data.name, seeds, agg, notes, output)
        for path in write_results(final, output):
            parent.log_artifact(path)
    return final


def _advts(setup: Setup, eval_also: Sequence[str]) -> LabelledSet | None:
    if "advts" not in eval_also:
        return None
    target = ADVTS_TARGETS.get(setup.data.name)
    if target is None:
        raise DataError(
            f"AdvTS has no adversarial set for '{setup.data.name}'",
            "use --eval-also advts with the TNCC title task or tusa",
        )
    advts = load_advts(target)
    if advts.labels != setup.data.labels:
        raise DataError(f"AdvTS labels for {target} differ from {setup.data.name}'s label list")
    return advts


def _run_seed(
    setup: Setup,
    cfg: Config,
    seed: int,
    directory: Path,
    unseen: list[int],
    advts: LabelledSet | None,
    run: Tracker,
) -> SeedResult:
    ft = cfg.finetune
    fingerprint = _fingerprint(setup, cfg, seed, advts is not None)
    weights = setup.pretrained_sha256
    data_sha256 = _data_sha256(setup, advts)
    done = _load_seed(directory, fingerprint, weights, data_sha256)
    why = ""
    if done is not None and _lacks_predictions(done):
        done = _rescore(done, setup, ft, unseen, advts, fingerprint, weights)
        why = "" if done is not None else RESCORE_FAILED
    _say_resume(seed, directory, done is not None, why)
    if done is None and (directory / SEED_FILE).is_file():
        _drop_stale_results(directory.parent)
    if done is not None:
        if not done.record_id:  # a record from before record ids: it gets one now
            done.record_id = uuid.uuid4().hex
            _save_seed(done, fingerprint, weights)
        # a standalone rerun reports the seed under a new parent run: the tag tells `runs
        # compare` that this is the record an earlier run reported, not another seed
        run.set_tags({"resumed": "true", TAG_SEED_RECORD: done.record_id})
        _log_seed(run, done.metrics)
        return done
    set_seed(seed)
    model = build_classifier(setup.meta)  # with the reader `meta.reading` names
    if setup.pretrained is not None:  # same keys: built from the same config
        inner_encoder(model.encoder).load_state_dict(setup.pretrained)
    if model.static_vectors is not None:  # pretrained, or the twin's random table
        if setup.static is not None:
            model.static_vectors.copy_(setup.static)
        else:
            model.static_vectors.normal_()
    figures, on_epoch = prepare_reader(model.encoder, ft, setup.ids)
    if setup.meta.reading.mode != "truncate":
        run.log_metrics({"long_document_window": float(setup.meta.max_len), **figures})
    data, ids, labels = setup.data, setup.ids, setup.data.labels
    y_train = data.targets("train")[: len(ids["train"])]
    if ft.probe_epochs:  # LP-FT: the head first, on the frozen encoder
        model.freeze_encoder(True)
        train_one_seed(
            model,
            ids["train"],
            y_train,
            ids["validation"],
            data.targets("validation"),
            probe_recipe(ft),
            seed,
            PrefixedRun(run, "probe/"),
            cfg.engine,
            labels,
            on_epoch,
        )
    model.freeze_encoder(ft.freeze_encoder)

    def train(copy_seed: int, copy_run: Any, mlm: Any) -> tuple[int, int, Metrics]:
        return train_one_seed(
            model,
            ids["train"],
            y_train,
            ids["validation"],
            data.targets("validation"),
            ft,
            copy_seed,
            copy_run,
            cfg.engine,
            labels,
            on_epoch,
            mlm,
            _resegment(setup, ft, copy_seed),
        )

    if ft.soup == 1:
        best_epoch, epochs_run, validation = train(seed, run, _aux_mlm(setup, ft, seed))
    else:
        key = f"{fingerprint}:{weights}:{data_sha256}"
        aux = functools.partial(_aux_mlm, setup, ft)
        copies = fine_tune_copies(train, aux, model, ft.soup, seed, run, directory, key)
        validation = cook_soup(model, copies, setup, ft, run)
        best_epoch, epochs_run = copies[0].best_epoch, copies[0].epochs_run  # the plain run's

    # DeepSpeed's fp16 mode (a GPU without bf16) trains the module's own weights in half
    # precision; `tibnlp predict` loads the saved weights into an fp32 classifier. Score
    # (validation again too) and save what predict will run, not the half-precision model.
    half = any(p.dtype != torch.float32 for p in model.parameters())
    if half:
        model.float()
    metrics = _score(setup, ft, model, unseen, advts, None if half else validation)
    save_classifier(directory, model, setup.meta, setup.vocab_dir)
    for part, m in metrics.items():
        png = confusion_png(m.confusion, labels, directory / f"confusion_{part}.png", part)
        run.log_artifact(png, "confusion")
    result = SeedResult(seed, best_epoch, epochs_run, metrics, directory)
    result.record_id, result.data_sha256 = uuid.uuid4().hex, data_sha256
    _save_seed(result, fingerprint, weights)
    run.set_tags({TAG_SEED_RECORD: result.record_id})
    _log_seed(run, metrics)
    run.log_artifact(directory / SEED_FILE)  # per-class reports and confusion counts
    run.log_artifact(directory / "classifier.yaml")
    return result


def _say_resume(seed: int, directory: Path, reused: bool, why: str = "") -> None:
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


def _drop_stale_results(output: Path) -> None:
    """Remove the results.json and results.md of an earlier run in `output` once one of its
    seeds is trained again: they give that seed's old scores, and a run stopped before its
    own results are written would leave them beside the new classifier (`finetune report`
    showing the old scores and recipe as this folder's result)."""
    for name in (RESULTS_JSON, RESULTS_MD):
        (output / name).unlink(missing_ok=True)


def _resegment(setup: Setup, ft: FinetuneConfig, seed: int) -> SampledSegmentation | None:
    """The training texts' sampled segmentations (`finetune.subword_alpha`); None when off."""
    if not ft.subword_alpha:
        return None
    return SampledSegmentation(
        setup.vocab,
        setup.train_texts,
        read_length(setup.meta),
        ft.subword_alpha,
        ft.subword_nbest,
        seed,
    )


def _aux_mlm(setup: Setup, ft: FinetuneConfig, seed: int) -> tuple[MlmHead, TokenMasker] | None:
    """The MLM head (the pretrained one, or fresh for a random-init encoder) and the masker
    of `finetune.mlm_weight`; None when it is off."""
    if not ft.mlm_weight:
        return None
    model = setup.meta.model
    head = MlmHead(model)
    if setup.pretrained is not None:
        head.load_pretrained_head(Path(ft.model_dir))
    vocab = setup.vocab
    masker = TokenMasker(model.vocab_size, vocab.mask_id, vocab.special_ids, ft.mlm_prob, seed)
    return head, masker


def _log_seed(run: Tracker, metrics: dict[str, Metrics]) -> None:
    for part, m in metrics.items():
        run.log_metrics({f"{part}_{k}": v for k, v in m.summary.items()})
    if "advts" in metrics:
        drop = {
            f"advts_drop_{k}": metrics["advts_original"][k] - metrics["advts"][k]
            for k in ("accuracy", "macro_f1", "weighted_f1")
        }
        run.log_metrics(drop)


def _data_sha256(setup: Setup, advts: LabelledSet | None) -> str:
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


def _fingerprint(setup: Setup, cfg: Config, seed: int, advts: bool) -> str:
    """Everything that determines a seed's result (not where it is written)."""
    # settings added later enter only when set (ADDED_WHEN_SET): earlier seeds keep their key;
    # engine settings that change results (precision, ZeRO) only when not the defaults
    hashed = output_settings(to_dict(cfg), ("finetune", "engine"))
    settings = {k: v for k, v in hashed.pop("finetune").items() if k not in ("seeds", "output")}
    meta = to_dict(setup.meta)
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


def _score(
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


def _lacks_predictions(done: SeedResult) -> bool:
    """A seed record written before item-level predictions were kept."""
    return any(m.count and not m.predictions for m in done.metrics.values())


def _rescore(
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
    metrics = _score(setup, ft, model, unseen, advts)
    for part, old in done.metrics.items():
        new = metrics.get(part)
        if new is None or abs(new.summary["macro_f1"] - old.summary["macro_f1"]) > 1e-9:
            return None
    rescored = dataclasses.replace(done, metrics=metrics)
    _save_seed(rescored, fingerprint, weights)
    return rescored


def _save_seed(result: SeedResult, fingerprint: str, weights: str = "") -> None:
    """The seed's record (`_load_seed` reads it back on a rerun), written atomically."""
    saved = {
        "fingerprint": fingerprint,
        "pretrained_sha256": weights,
        "record_id": result.record_id,
        "data_sha256": result.data_sha256,
        "seed": result.seed,
        "best_epoch": result.best_epoch,
        "epochs_run": result.epochs_run,
        "metrics": {p: dataclasses.asdict(m) for p, m in result.metrics.items()},
    }
    atomic_write_text(result.directory / SEED_FILE, result_json(saved, indent=1))


def _load_seed(
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
    )
