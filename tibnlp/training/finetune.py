"""Fine-tuning a classifier: data, encoder and head from config; seeds; metrics; MLflow.

The loop is kept to one small function (`train_one_seed`: AdamW with warmup, an epoch of steps,
validation macro-F1, early stopping, best state restored) so that it can move onto the shared
step/eval/log loop of `training/loop.py` when that exists: what is specific to fine-tuning is
only the batches (`_batches`), the loss (cross-entropy on logits) and the selection metric.
"""

from __future__ import annotations

import copy
import math
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from torch import nn

from tibnlp.config import Config, to_dict
from tibnlp.config.finetune import FinetuneConfig
from tibnlp.config.model import ModelConfig
from tibnlp.config.train import OptimizerConfig
from tibnlp.data.collate import encode_texts, pad_batch
from tibnlp.data.tasks import MODEL_TEXT_FORM, LabelledSet, load_advts, load_dataset, load_tncc
from tibnlp.errors import DataError
from tibnlp.evaluation.leakage import unseen_indices
from tibnlp.evaluation.metrics import Metrics, aggregate, compute_metrics
from tibnlp.evaluation.plots import confusion_png
from tibnlp.evaluation.predict import predict_proba
from tibnlp.evaluation.report import write_results
from tibnlp.models.classifier import HeadConfig
from tibnlp.models.classifier_io import ClassifierMeta, build_classifier, save_classifier
from tibnlp.models.io import load_encoder
from tibnlp.text.vocab import MODEL_FILE, Vocabulary
from tibnlp.tracking.tracker import Tracker

TASK_MAX_LEN = {"tncc-title": 50, "tncc-document": 300}
ADVTS_TARGETS = {"tncc-title": "tncc", "tusa": "tusa"}


@dataclass
class SeedResult:
    seed: int
    best_epoch: int
    epochs_run: int
    metrics: dict[str, Metrics]  # validation, test, test_unseen, advts_original, advts
    directory: Path
    run_id: str | None = None


@dataclass
class FinetuneResult:
    system: str  # e.g. "albert-pretrained(tiny)+cnn"
    dataset: str
    seeds: list[SeedResult]
    aggregate: dict[str, dict[str, tuple[float, float]]]  # part -> metric -> (mean, std)
    notes: dict[str, Any] = field(default_factory=dict)
    output: Path = Path()


@dataclass
class Setup:
    """Everything resolved before training: data as ids, the vocabulary, the meta to save."""

    data: LabelledSet
    ids: dict[str, list[list[int]]]
    meta: ClassifierMeta
    vocab: Vocabulary
    vocab_dir: Path
    pretrained: dict[str, torch.Tensor] | None
    system: str


def load_task_data(dataset: str, task: str) -> LabelledSet:
    return load_tncc(task) if dataset == "tncc" else load_dataset(dataset)


def prepare(cfg: Config, data: LabelledSet) -> Setup:
    """Resolve the encoder (pretrained / random / none) and vocabulary; encode every split."""
    ft = cfg.finetune
    pretrained = None
    model_cfg: ModelConfig = copy.deepcopy(cfg.model)
    if ft.random_init:
        if not ft.vocab:
            raise DataError(
                "no vocabulary: a randomly initialised or from-scratch model needs one",
                "pass --vocab DIR (a `tibnlp vocab build` output) or --model DIR",
            )
        vocab_dir = Path(ft.vocab)
    else:
        model_dir = Path(ft.model)
        if not model_dir.is_dir():
            raise DataError(f"model directory {model_dir} does not exist")
        model_cfg, encoder = load_encoder(model_dir)
        pretrained = encoder.state_dict()
        # the vocabulary is copied beside the weights at pretraining; --vocab must match it
        vocab_dir = model_dir if (model_dir / MODEL_FILE).is_file() else Path(ft.vocab or ".")
        if vocab_dir != model_dir and not ft.vocab:
            raise DataError(
                f"model directory {model_dir} holds no vocabulary ({MODEL_FILE})",
                "pass --vocab DIR with the vocabulary the model was pretrained with",
            )
    vocab = _load_vocab(vocab_dir)
    if not ft.random_init and ft.vocab and vocab_dir != Path(ft.vocab):
        other = _load_vocab(Path(ft.vocab))
        if other.sha256 != vocab.sha256:
            raise DataError(
                f"vocabulary {ft.vocab} (sha256 {other.sha256[:12]}) is not the one model "
                f"{ft.model} was pretrained with ({vocab.sha256[:12]})",
                "drop --vocab (the model directory's own vocabulary is used) or pass the "
                "matching model",
            )
    if ft.random_init:
        model_cfg.vocab_size = vocab.size
    elif vocab.size > model_cfg.vocab_size:
        raise DataError(
            f"vocabulary in {vocab_dir} has {vocab.size} pieces but model {ft.model} embeds only "
            f"{model_cfg.vocab_size}: ids would be out of range",
            "the model directory holds a different vocabulary than its weights were trained on",
        )
    max_len = ft.max_len or TASK_MAX_LEN.get(data.name) or data.max_len or 128
    if ft.encoder == "albert":
        max_len = min(max_len, model_cfg.max_len)
    head = HeadConfig(ft.head, list(ft.cnn_kernels), ft.cnn_channels, ft.dropout, ft.pooling)
    meta = ClassifierMeta(
        encoder="embedding" if ft.encoder == "none" else "albert",
        labels=list(data.labels),
        max_len=max_len,
        vocab_sha256=vocab.sha256,
        vocab_size=vocab.size if ft.encoder == "none" else model_cfg.vocab_size,
        head=head,
        model=model_cfg,
        embedding_size=ft.embedding_size,
        text_form=MODEL_TEXT_FORM,
        dataset=data.name,
        source_model="" if ft.random_init else str(ft.model),
    )
    ids = {split: encode_texts(vocab, data.texts(split), max_len) for split in data.splits}
    if ft.limit_train:
        ids["train"] = ids["train"][: ft.limit_train]
    return Setup(data, ids, meta, vocab, vocab_dir, pretrained, system_name(ft))


def system_name(ft: FinetuneConfig) -> str:
    if ft.encoder == "none":
        return "textcnn-pieces(scratch)"
    base = "albert-random" if ft.random_init else f"albert-pretrained({Path(ft.model).name})"
    head = ft.head if ft.head == "cnn" else f"linear-{ft.pooling}"
    return f"{base}+{head}" + ("+frozen" if ft.freeze_encoder else "")


def _load_vocab(directory: Path) -> Vocabulary:
    if not directory.is_dir():
        raise DataError(f"vocabulary directory {directory} does not exist")
    return Vocabulary.load(directory)


def run_finetune(cfg: Config, dataset: str, task: str = "title") -> FinetuneResult:
    """Fine-tune one system on one dataset for every seed; log, save, aggregate, report."""
    ft = cfg.finetune
    if cfg.engine.threads:
        torch.set_num_threads(cfg.engine.threads)
    data = load_task_data(dataset, task)
    setup = prepare(cfg, data)
    output = Path(ft.output) / data.name / setup.system.replace("/", "_")
    train_keys = set(data.texts("train"))
    unseen = unseen_indices(train_keys, data.texts("test"))
    advts = _advts(setup, ft.eval_also)
    notes = {
        "input_form": f"{MODEL_TEXT_FORM} (spaces between syllables joined with U+0F0B, NFC)",
        "stored_form": data.source_form,
        "max_len": setup.meta.max_len,
        "sizes": {s: len(v) for s, v in setup.ids.items()},
        "test_unseen": f"{len(unseen)} of {len(data.splits['test'])} test texts not in train",
        "vocab": str(setup.vocab_dir),
        "vocab_sha256": setup.vocab.sha256,
        "model": setup.meta.source_model or "random init / none",
    }
    tracking = cfg.tracking
    tags = {"stage": "finetune", "dataset": data.name, "system": setup.system}
    seeds: list[SeedResult] = []
    with Tracker(
        tracking.experiment,
        tracking.run_name or f"{data.name} {setup.system}",
        tracking.uri,
        tracking.enabled,
        tags=tags,
    ) as parent:
        parent.log_params(to_dict(cfg.finetune) | {"model_config": to_dict(setup.meta.model)})
        parent.set_tags({k: str(v) for k, v in notes.items()})
        for seed in ft.seeds:
            with Tracker(
                tracking.experiment,
                f"seed {seed}",
                tracking.uri,
                tracking.enabled,
                parent_run_id=parent.run_id,
                tags=tags | {"seed": str(seed)},
            ) as run:
                result = _run_seed(setup, ft, seed, output / f"seed-{seed}", unseen, advts, run)
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
    ft: FinetuneConfig,
    seed: int,
    directory: Path,
    unseen: list[int],
    advts: LabelledSet | None,
    run: Tracker,
) -> SeedResult:
    set_seed(seed)
    model = build_classifier(setup.meta)
    if setup.pretrained is not None:
        model.encoder.load_state_dict(setup.pretrained)  # same keys: built from the same config
    model.freeze_encoder(ft.freeze_encoder)
    data, ids, labels = setup.data, setup.ids, setup.data.labels
    y_train = data.targets("train")[: len(ids["train"])]
    best_epoch, epochs_run = train_one_seed(
        model, ids["train"], y_train, ids["validation"], data.targets("validation"), ft, seed, run
    )

    def evaluate(x: Sequence[Sequence[int]], y: Sequence[int]) -> Metrics:
        probs = predict_proba(model, x, ft.eval_batch_size, setup.vocab.pad_id)
        return compute_metrics(y, probs.argmax(axis=1).tolist(), labels)

    y_test = data.targets("test")
    metrics = {
        "validation": evaluate(ids["validation"], data.targets("validation")),
        "test": evaluate(ids["test"], y_test),  # the only time the test split is scored
        "test_unseen": evaluate([ids["test"][i] for i in unseen], [y_test[i] for i in unseen]),
    }
    if advts is not None:
        for part, key in (("original", "advts_original"), ("adversarial", "advts")):
            x = encode_texts(setup.vocab, advts.texts(part), setup.meta.max_len)
            metrics[key] = evaluate(x, advts.targets(part))
    save_classifier(directory, model, setup.meta, setup.vocab_dir)
    for part, m in metrics.items():
        run.log_metrics({f"{part}_{k}": v for k, v in m.summary.items()})
        png = confusion_png(m.confusion, labels, directory / f"confusion_{part}.png", part)
        run.log_artifact(png, "confusion")
    if advts is not None:
        drop = {
            f"advts_drop_{k}": metrics["advts_original"][k] - metrics["advts"][k]
            for k in ("accuracy", "macro_f1", "weighted_f1")
        }
        run.log_metrics(drop)
    run.log_artifact(directory / "classifier.yaml")
    return SeedResult(seed, best_epoch, epochs_run, metrics, directory)


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _batches(
    ids: Sequence[Sequence[int]], y: Sequence[int], batch_size: int, rng: random.Random
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    order = list(range(len(ids)))
    rng.shuffle(order)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        input_ids, mask = pad_batch([ids[i] for i in chunk])
        yield input_ids, mask, torch.tensor([y[i] for i in chunk], dtype=torch.long)


def lr_lambda(opt: OptimizerConfig, warmup: int, total: int) -> Any:
    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if opt.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if opt.schedule == "linear":
            decay = 1.0 - progress
        else:
            decay = 0.5 * (1 + math.cos(math.pi * progress))
        return opt.min_lr_ratio + (1.0 - opt.min_lr_ratio) * decay

    return factor


def train_one_seed(
    model: nn.Module,
    x_train: Sequence[Sequence[int]],
    y_train: Sequence[int],
    x_val: Sequence[Sequence[int]],
    y_val: Sequence[int],
    ft: FinetuneConfig,
    seed: int,
    run: Tracker,
) -> tuple[int, int]:
    """Train until validation macro-F1 stops improving; restore the best state in place.

    Returns (best epoch, epochs run), both 1-based.
    """
    opt = ft.optimizer
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": opt.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=opt.lr,
        betas=(opt.betas[0], opt.betas[1]),
        eps=opt.eps,
    )
    steps_per_epoch = math.ceil(len(x_train) / ft.batch_size)
    total = steps_per_epoch * ft.epochs
    warmup = opt.warmup_steps or round(ft.warmup_ratio * total)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(opt, warmup, total))
    rng = random.Random(seed)
    best_f1, best_epoch, best_state, stale, epoch = -1.0, 0, None, 0, 0
    loss_fn = nn.CrossEntropyLoss()
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, transient=True) as progress:
        for epoch in range(1, ft.epochs + 1):
            model.train()
            bar = progress.add_task(f"seed {seed} epoch {epoch}", total=steps_per_epoch, rate="")
            losses: list[float] = []
            started = time.monotonic()
            for input_ids, mask, target in _batches(x_train, y_train, ft.batch_size, rng):
                loss = loss_fn(model(input_ids, mask), target)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if opt.grad_clip > 0:
                    nn.utils.clip_grad_norm_(params, opt.grad_clip)
                optimizer.step()
                scheduler.step()
                losses.append(loss.item())
                rate = len(losses) / max(time.monotonic() - started, 1e-9)
                progress.update(bar, advance=1, rate=f"{rate:.1f} it/s loss {losses[-1]:.3f}")
            progress.remove_task(bar)
            probs = predict_proba(model, x_val, ft.eval_batch_size)
            names = [str(i) for i in range(probs.shape[1])]  # every class counts in macro-F1
            val_f1 = compute_metrics(y_val, probs.argmax(axis=1).tolist(), names)["macro_f1"]
            run.log_metrics(
                {
                    "train_loss": float(np.mean(losses)),
                    "validation_macro_f1": val_f1,
                    "lr": float(scheduler.get_last_lr()[0]),
                },
                step=epoch,
            )
            if val_f1 > best_f1:
                best_f1, best_epoch, stale = val_f1, epoch, 0
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            else:
                stale += 1
                if stale >= ft.patience:
                    break
    if best_state is not None:
        model.load_state_dict(best_state)
    return best_epoch, epoch
