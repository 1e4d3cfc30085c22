"""Fine-tuning a classifier: seeds, metrics, seed records and MLflow, on the `Setup` that
`finetune_setup.prepare` resolves (data, encoder, vocabulary).

One parent MLflow run per command, one child run per seed. Each finished seed leaves its
classifier directory and `seed_result.json` (with a fingerprint of everything that determines
the result), so rerunning the same command resumes: finished seeds are reported, not retrained
(the record and its key: `finetune_seeds.py`; the scores: `finetune_scores.py`). Training
runs on the one loop (`loop.TrainLoop`); what is specific to classification is in
`classification.py`.
"""

from __future__ import annotations

import contextlib
import functools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from tibnlp.config import Config, to_dict
from tibnlp.config.finetune import FinetuneConfig, TaskName
from tibnlp.data.collate import SampledSegmentation
from tibnlp.data.input_mask import InputMasker
from tibnlp.data.labelled import LabelledSet
from tibnlp.data.tasks import canonical_dataset, load_advts, load_classification
from tibnlp.errors import DataError
from tibnlp.evaluation.leakage import unseen_indices
from tibnlp.evaluation.metrics import Metrics, aggregate, majority_macro_f1
from tibnlp.evaluation.plots import confusion_png
from tibnlp.evaluation.report import write_results
from tibnlp.models.classifier_io import (
    build_classifier,
    read_length,
    save_classifier,
)
from tibnlp.models.long_documents.reading import inner_encoder
from tibnlp.tracking import (
    PrefixedRun,
    Tracker,
    provenance_tags,
    require_store,
    tracker_from_config,
)
from tibnlp.tracking.conventions import (
    TAG_DATA,
    TAG_PRETRAIN_RUN,
    TAG_SEED_RECORD,
    pretrain_params,
)
from tibnlp.training.aux_mlm import MlmHead, TokenMasker
from tibnlp.training.classification import probe_recipe, set_seed, train_one_seed
from tibnlp.training.finetune_notes import pretraining_of, run_notes, warn_if_majority
from tibnlp.training.finetune_record import SEED_FILE, SeedResult, save_seed
from tibnlp.training.finetune_scores import score_seed
from tibnlp.training.finetune_seeds import (
    SEED_DIR_PREFIX,
    extra_sha256,
    require_same_dataset,
    resumed_seed,
    seed_fingerprint,
)
from tibnlp.training.finetune_setup import Setup, prepare
from tibnlp.training.finetune_splits import texts
from tibnlp.training.held_output import held_output
from tibnlp.training.long_documents import prepare_reader
from tibnlp.training.ranks import from_main, is_main_process, owns_output, wait_for_main
from tibnlp.training.registration import register_result
from tibnlp.training.soup_run import cook_soup, fine_tune_copies

ADVTS_TARGETS = {"tncc-title": "tncc", "tusa": "tusa"}


@dataclass
class FinetuneResult:
    system: str  # e.g. "albert-pretrained(tiny)+cnn"
    dataset: str
    seeds: list[SeedResult]
    aggregate: dict[str, dict[str, tuple[float, float]]]  # part -> metric -> (mean, std)
    notes: dict[str, Any] = field(default_factory=dict)
    output: Path = Path()
    registered_model: str = ""  # the registry name its best seed went to (tracking.register_model)
    registered_seed: int | None = None


def _same_dataset_held(output: Path, data: LabelledSet) -> contextlib.AbstractContextManager[None]:
    """`require_same_dataset` where the output folder is held, before the run opens."""
    if owns_output():
        require_same_dataset(output, data)
    return contextlib.nullcontext()


def run_finetune(
    cfg: Config, dataset: str, task: TaskName = "title", wait: bool = False
) -> FinetuneResult:
    """Fine-tune one system on one dataset for every seed; log, save, aggregate, report.
    The output folder is held for the run (`held_output`): with `wait`, a run finding it in
    use waits for it instead of refusing."""
    ft = cfg.finetune
    # the batch split over the processes before the task is read and tokenised (the engine
    # would refuse it only at the first seed's training)
    from tibnlp.training.engine import (
        accumulation_steps,
        init_distributed,
        planned_world_size,
    )

    accumulation_steps(ft.batch_size, 0, planned_world_size(), "finetune.batch_size")
    if cfg.engine.threads:
        torch.set_num_threads(cfg.engine.threads)
    data = load_classification(dataset, task)  # a shipped set's name or a folder of one's own
    # the set as read here, in its one spelling, is what the seeds' fingerprint and the logged
    # config hold: a config naming another set (`finetune tncc -c FILE`) kept that one in its
    # seeds' key, and `classify --dataset tncc_document` retrained `tncc --task document`'s
    named, read_task = canonical_dataset(data)
    cfg = replace(cfg, finetune=replace(ft, dataset=named, task=read_task))
    ft = cfg.finetune
    tracking = cfg.tracking
    if not is_main_process():  # data parallel: one run (rank 0's), not one each
        tracking = replace(tracking, enabled=False)
    require_store(tracking)  # before the tokenising: a store that cannot open fails now
    setup = prepare(cfg, data)
    output = Path(ft.output) / data.name / setup.system.replace("/", "_")
    unseen = unseen_indices(setup.train_texts, texts(data, "test", ft.text_form))
    advts = _advts(setup, ft.eval_also)
    # a validation macro-F1 at this level is a classifier collapsed onto one class
    majority = majority_macro_f1(data.targets("validation"), len(data.labels))
    notes = run_notes(ft, data, setup, len(unseen), majority, advts)
    tags = {"stage": "finetune", "dataset": data.name, "system": setup.system}
    # the pretraining behind the number (step, tokens, seconds...): what a learning curve plots
    extra = pretraining_of(ft)
    if setup.meta.source_model:
        notes["pretraining"] = extra
    budget = pretrain_params(extra, ft.random_init)
    if extra.get("mlflow_run_id"):  # also for the baselines: whose shape or vocabulary they use
        tags[TAG_PRETRAIN_RUN] = str(extra["mlflow_run_id"])
    seeds: list[SeedResult] = []
    # the encoder actually loaded (from the model directory), not the config's model section
    described = {k: v for k, v in to_dict(cfg).items() if k != "tracking"}
    described["model"] = to_dict(setup.meta.model)
    in_stage = bool(tracking.run_id)  # a pipeline stage's run: it holds the config already
    main = is_main_process()
    meet = None  # data parallel: the other ranks wait for rank 0 to hold the output folder
    if planned_world_size() > 1:
        init_distributed(cfg.engine)
        meet = wait_for_main
    if owns_output():  # (the other ranks wait for rank 0 in `meet`, and stop if it failed)
        require_same_dataset(output, data)
    with (
        held_output(output, main, not in_stage, wait, meet) as note_run,
        # again once held: a run `--wait` waited for may have left another set's seeds there
        _same_dataset_held(output, data),
        tracker_from_config(tracking, f"{data.name} {setup.system}", tags) as parent,
    ):
        note_run(parent)  # a SIGKILL ends no run: the next run in this folder ends it
        if not in_stage:
            parent.log_params(to_dict(cfg.finetune))
        parent.log_params({"model_config": to_dict(setup.meta.model), **budget})
        parent.set_tags({k: str(v) for k, v in notes.items()})
        cut = notes["cut_at_read_length"]  # per part (AdvTS's too), beside the read length
        parent.log_metrics(
            {
                f"cut_{s}_{k}": float(n)
                for s, c in cut.items()
                if s != "read_length"
                for k, n in c.items()
            }
        )
        # a folder set's files by content (a pipeline stage's run has its data hash already)
        files = {TAG_DATA: data.files_sha256} if data.files_sha256 and not in_stage else {}
        parent.set_tags(
            provenance_tags(
                vocab=setup.vocab_dir, parent_model=setup.meta.source_model, extra=files
            )
        )
        for seed in ft.seeds:
            # seeds are the leaves `runs compare` groups: they carry the config and model tags
            with parent.child(
                f"seed {seed}", tags={**tracking.tags, **tags, "seed": str(seed)}
            ) as run:
                run.log_params({**described, **budget})
                result = _run_seed(
                    setup, cfg, seed, output / f"{SEED_DIR_PREFIX}{seed}", unseen, advts, run
                )
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
        for path in write_results(final, output) if owns_output() else []:
            parent.log_artifact(path)
        if tracking.register_model:  # here only, standalone or in a pipeline stage
            register_result(parent, tracking, final, in_stage)
    return final


def _advts(setup: Setup, eval_also: Sequence[str]) -> LabelledSet | None:
    if "advts" not in eval_also:
        return None
    # (by name: a folder set of one's own named "tusa" is not TU_SA)
    folder = getattr(setup.data, "folder", "")
    target = None if folder else ADVTS_TARGETS.get(setup.data.name)
    if target is None:
        raise DataError(
            f"AdvTS has no adversarial set for '{setup.data.name}'"
            + (f" (your own set, {folder})" if folder else ""),
            "use --eval-also advts with the TNCC title task or tusa",
        )
    advts = load_advts(target)
    if advts.labels != setup.data.labels:
        raise DataError(
            f"AdvTS labels for {target} differ from {setup.data.name}'s label list",
            "one of the two labels files was changed: restore it (`tibnlp data list` names a "
            "dataset's changed files), or run without --eval-also advts",
        )
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
    fingerprint = seed_fingerprint(setup, cfg, seed)
    weights, data_sha256 = setup.pretrained_sha256, setup.data_sha256
    evals = extra_sha256(setup, advts)
    main = owns_output()  # (data parallel: rank 0 alone reads and writes the folder)
    done = None
    if main:
        done = resumed_seed(directory, setup, cfg, seed, unseen, advts, fingerprint, evals)
    done = from_main(done, f"look for seed {seed}'s result in {directory}")
    if done is not None:
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
            _input_masker(setup, ft, copy_seed),
        )

    if ft.soup == 1:
        best_epoch, epochs_run, validation = train(seed, run, _aux_mlm(setup, ft, seed))
    else:
        key = f"{fingerprint}:{weights}:{data_sha256}"
        aux = functools.partial(_aux_mlm, setup, ft)
        copies = fine_tune_copies(train, aux, model, ft.soup, seed, run, directory, key, main)
        validation = cook_soup(model, copies, setup, ft, run)
        best_epoch, epochs_run = copies[0].best_epoch, copies[0].epochs_run  # the plain run's

    # DeepSpeed's fp16 mode (a GPU without bf16) trains the module's own weights in half
    # precision; `tibnlp predict` loads the saved weights into an fp32 classifier. Score
    # (validation again too) and save what predict will run, not the half-precision model.
    half = any(p.dtype != torch.float32 for p in model.parameters())
    if half:
        model.float()
    result = None
    if main:  # the ranks trained the same weights: rank 0 scores and saves them
        metrics = score_seed(setup, ft, model, unseen, advts, None if half else validation)
        # (the set's folder: what this output holds from now on, `require_same_dataset`)
        result = SeedResult(seed, best_epoch, epochs_run, metrics, directory)
        result.record_id, result.data_sha256 = uuid.uuid4().hex, data_sha256
        result.eval_sha256 = evals
        result.dataset_folder = setup.data.folder
        _save_seed_folder(result, model, setup, run, fingerprint, weights)
    shared = from_main(result, f"score and save seed {seed}")
    assert shared is not None
    return shared


def _save_seed_folder(
    result: SeedResult, model: Any, setup: Setup, run: Tracker, fingerprint: str, weights: str
) -> None:
    """The seed's classifier, confusion plots and record, written and logged."""
    directory = result.directory
    save_classifier(directory, model, setup.meta, setup.vocab_dir)
    for part, m in result.metrics.items():
        if not m.count:  # a part with no items (every test text also in train) has no plot
            continue
        png = confusion_png(
            m.confusion, setup.data.labels, directory / f"confusion_{part}.png", part
        )
        run.log_artifact(png, "confusion")
    save_seed(result, fingerprint, weights)
    run.set_tags({TAG_SEED_RECORD: result.record_id})
    _log_seed(run, result.metrics)
    run.log_artifact(directory / SEED_FILE)  # per-class reports and confusion counts
    run.log_artifact(directory / "classifier.yaml")


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


def _input_masker(setup: Setup, ft: FinetuneConfig, seed: int) -> InputMasker | None:
    """The training batches' [MASK] cutoff (`finetune.input_mask`); None when off."""
    if not ft.input_mask:
        return None
    return InputMasker(setup.vocab.mask_id, setup.vocab.special_ids, ft.input_mask, seed)


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
