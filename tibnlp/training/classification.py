"""What fine-tuning a classifier gives the one training loop (`loop.TrainLoop`): a module whose
forward returns the cross-entropy loss, shuffled epochs of labelled examples as a
`ShardedBatches` plan, and the validation evaluator whose macro-F1 picks the best epoch and
stops training early. Optimizer, schedule, clipping, logging and progress are the loop's and
the engine's, as in pretraining.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch
from torch import nn

from tibnlp.config.finetune import FinetuneConfig
from tibnlp.config.train import EngineConfig
from tibnlp.data.collate import SampledSegmentation, pad_batch
from tibnlp.data.input_mask import InputMasker
from tibnlp.data.masking import IGNORE_INDEX
from tibnlp.errors import ConfigError, DataError
from tibnlp.evaluation.metrics import Metrics, compute_metrics
from tibnlp.evaluation.predict import predict_proba
from tibnlp.models.classifier import Classifier
from tibnlp.models.encoder import Encoder
from tibnlp.models.long_documents.reading import inner_encoder
from tibnlp.training.adversarial import adversarial_loss, piece_table, piece_vectors
from tibnlp.training.aux_mlm import MlmHead, TokenMasker
from tibnlp.training.batches import ShardedBatches

if TYPE_CHECKING:  # the engine (deepspeed) loads when training starts, not with the CLI
    from tibnlp.training.wiring import Training

SHUFFLE_SALT = 1_000_003  # epoch e of seed s is shuffled with s * SALT + e


class ClassifierLoss(nn.Module):
    """The classifier as the loop trains it: ids, mask and labels in, loss and accuracy out,
    and the share of texts on the large head route (`train/route_large_fraction` per epoch,
    as in pretraining; under the batch rule the share of batches) when the encoder routes."""

    def __init__(
        self,
        model: Classifier,
        mlm_head: MlmHead | None = None,
        mlm_weight: float = 0.0,
        class_weights: torch.Tensor | None = None,
        adversarial: float = 0.0,
        l2sp: float = 0.0,
    ) -> None:
        super().__init__()
        self.model = model
        # L2-SP's anchors: the encoder's trainable weights as they are now (the start of the
        # main phase), as buffers that move with the model but are never saved
        self.l2sp = l2sp
        self._anchored: list[tuple[nn.Parameter, str]] = []
        if l2sp:
            for i, param in enumerate(p for p in model.encoder.parameters() if p.requires_grad):
                self.register_buffer(f"_l2sp_{i}", param.detach().clone(), persistent=False)
                self._anchored.append((param, f"_l2sp_{i}"))
        self.adversarial = adversarial  # > 0: FGM on the piece vectors (training.adversarial)
        if adversarial:
            piece_table(model.encoder)  # fails now, not at the first batch
        self.mlm_head = mlm_head  # with mlm_weight > 0: MLM on the batch beside (aux_mlm)
        self.mlm_weight = mlm_weight
        self.class_weights: torch.Tensor | None
        self.register_buffer("class_weights", class_weights)  # moves with the model

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor,
        mlm_input_ids: torch.Tensor | None = None,
        mlm_labels: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        def loss_of(logits: torch.Tensor) -> torch.Tensor:
            return nn.functional.cross_entropy(logits.float(), labels, weight=self.class_weights)

        perturb = self.adversarial and self.training and torch.is_grad_enabled()
        table = piece_table(self.model.encoder) if perturb else None
        with piece_vectors(table) as seen:
            logits, large = self.model.classify(input_ids, attention_mask)
        loss = loss_of(logits)
        accuracy = (logits.argmax(-1) == labels).float().mean()
        out = {"loss": loss, "accuracy": accuracy}
        if table is not None:
            out["clean_loss"] = loss.detach()
            # a frozen table with nothing trainable before it (the LP-FT probe): no direction
            if seen[-1].requires_grad:
                adversarial = adversarial_loss(
                    loss,
                    seen[-1],
                    lambda: self.model.classify(input_ids, attention_mask)[0],
                    loss_of,
                    table,
                    attention_mask,
                    self.adversarial,
                )
                out["loss"] = loss + adversarial
                out["adversarial_loss"] = adversarial.detach()
        if self._anchored and self.training and torch.is_grad_enabled():
            drift = sum(
                ((p.float() - getattr(self, name).float()) ** 2).sum() for p, name in self._anchored
            )
            penalty = 0.5 * self.l2sp * torch.as_tensor(drift)
            out["loss"] = out["loss"] + penalty
            out["l2sp_loss"] = penalty.detach()
        if large is not None:
            out["route_large_fraction"] = large.detach().float()
        if self.mlm_head is not None and mlm_input_ids is not None and mlm_labels is not None:
            encoder = self.model.encoder
            assert isinstance(encoder, Encoder)  # finetune.mlm_weight: validated at load
            sel = mlm_labels != IGNORE_INDEX  # one masked piece at least per non-empty text
            if not bool(sel.any()):  # a batch of texts without a piece: nothing to predict
                return out
            hidden = encoder(mlm_input_ids, attention_mask, outputs_at=sel).hidden[sel]
            mlm = self.mlm_head(hidden, encoder.embeddings.word.weight).float()
            mlm_loss = nn.functional.cross_entropy(mlm, mlm_labels[sel])
            out["loss"] = out["loss"] + self.mlm_weight * mlm_loss
            out["classification_loss"] = loss.detach()
            out["mlm_loss"] = mlm_loss.detach()
            out["mlm_accuracy"] = (mlm.argmax(-1) == mlm_labels[sel]).float().mean().detach()
        return out


class SeedTraining(NamedTuple):
    best_epoch: int  # 1-based
    epochs_run: int
    validation: Metrics  # of the restored (best) weights, labelled with `labels`


def class_weights(y_train: Sequence[int], num_labels: int, power: float) -> torch.Tensor | None:
    """Per-class loss weights (N / (K n_c))^power (`finetune.class_balance`); None at power 0.
    A class without training examples gets weight 1 (it never enters the loss)."""
    if not power:
        return None
    counts = torch.bincount(torch.tensor(list(y_train), dtype=torch.long), minlength=num_labels)
    counts = counts[:num_labels].float()
    weights = (counts.sum() / (num_labels * counts.clamp(min=1))) ** power
    return torch.where(counts > 0, weights, torch.ones_like(weights))


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def epoch_batches(
    ids: Sequence[Sequence[int]],
    y: Sequence[int],
    batch_size: int,
    seed: int,
    training: Training,
    on_epoch: Callable[[int], None] | None = None,
    masker: TokenMasker | None = None,
    resegment: SampledSegmentation | None = None,
    hide: InputMasker | None = None,
) -> ShardedBatches:
    """Every example once per epoch in a seed- and epoch-determined order. Only full batches
    are served (as in pretraining): the few examples of the last partial batch fall to another
    place in the next epoch's order, so none is left out for long. `on_epoch(epoch)` runs as
    each epoch starts (e.g. GEMFormer refreshing its memory with the current weights). With a
    `masker`, each batch also carries its masked copy for the MLM beside (`aux_mlm`); with
    `resegment`, its texts are read in freshly drawn segmentations instead of `ids`; with
    `hide`, some of its pieces are read as [MASK] (the MLM beside masks the whole text)."""

    def plan(epoch: int) -> list[list[int]]:
        if on_epoch is not None:
            on_epoch(epoch)
        order = list(range(len(ids)))
        random.Random(seed * SHUFFLE_SALT + epoch).shuffle(order)
        return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]

    def collate(indices: Sequence[int], key: int) -> dict[str, torch.Tensor]:
        rows = resegment(indices, key) if resegment else [ids[i] for i in indices]
        input_ids, mask = pad_batch(rows)
        labels = torch.tensor([y[i] for i in indices], dtype=torch.long)
        batch = {"input_ids": input_ids, "attention_mask": mask, "labels": labels}
        if masker is not None:
            batch["mlm_input_ids"], batch["mlm_labels"] = masker(input_ids, mask, key)
        if hide is not None:
            batch["input_ids"] = hide(input_ids, mask, key)
        return batch

    return training.batches(plan, collate, batch_size)


def probe_recipe(ft: FinetuneConfig) -> FinetuneConfig:
    """The first phase of LP-FT (`finetune.probe_epochs`): the head alone, at `probe_lr` (else
    the head's rate), for exactly `probe_epochs` (no early stop; the best validation epoch's
    head is kept), without the MLM or the adversarial batches beside (the encoder they would
    train is frozen), in the best segmentation, with every piece read."""
    lr = ft.probe_lr or ft.head_lr or ft.optimizer.lr
    return dataclasses.replace(
        ft,
        epochs=ft.probe_epochs,
        patience=ft.probe_epochs,
        probe_epochs=0,
        head_lr=0.0,
        embedding_lr=0.0,
        layer_decay=1.0,
        mlm_weight=0.0,
        adversarial=0.0,
        subword_alpha=0.0,
        l2sp=0.0,
        input_mask=0.0,
        optimizer=dataclasses.replace(ft.optimizer, lr=lr),
    )


def _check_device(name: str) -> None:
    """Training runs where the engine runs (the GPU when there is one)."""
    cuda = torch.cuda.is_available()
    if name == "cuda" and not cuda:
        raise ConfigError("config key 'finetune.device': cuda asked but no GPU is visible")
    if name == "cpu" and cuda:
        raise ConfigError(
            "config key 'finetune.device': cpu asked but the engine trains on the visible GPU",
            "hide the GPUs (CUDA_VISIBLE_DEVICES=) to fine-tune on the CPU, or use auto",
        )


def learning_rates(model: Classifier, ft: FinetuneConfig) -> dict[str, float]:
    """Parameter-name prefixes inside `ClassifierLoss` -> their own peak lr (0: optimizer.lr;
    the first matching prefix wins). `finetune.layer_decay` < 1 gives layer i of L the rate
    lr * decay^(L - i) and the embedding layer lr * decay^L (ELECTRA's layer-wise decay; ULMFiT's
    discriminative rates): the lower a layer, the more general what it learnt in pretraining
    and the less the labels should move it; memory tokens (`model.memory_tokens`) decay with
    the embedding layer. An explicit `finetune.embedding_lr` wins for the embedding layer."""
    # prefixes by module, not spelt out: a long-document reader holds the encoder one level
    # down (model.encoder.encoder.)
    names = {id(m): f"model.{name}." for name, m in model.named_modules()}
    embeddings = f"{names[id(inner_encoder(model.encoder))]}embeddings."
    rates = {"model.head.": ft.head_lr, embeddings: ft.embedding_lr}
    if ft.layer_decay == 1.0:
        return rates
    encoder = model.encoder
    if not isinstance(encoder, Encoder) or encoder.cfg.share_layers:
        raise ConfigError(
            "config key 'finetune.layer_decay': layer-wise rates need a transformer encoder "
            "with a layer of its own per depth (model.share_layers false, long_document "
            "truncate)",
            "set finetune.layer_decay=1",
        )
    depth, lr = encoder.cfg.num_layers, ft.optimizer.lr
    if not ft.embedding_lr:
        rates[embeddings] = lr * ft.layer_decay**depth
    for i in range(depth):  # layer i + 1 of 1..L
        rates[names[id(encoder.layer_at(i))]] = lr * ft.layer_decay ** (depth - 1 - i)
    if encoder.memory_tokens is not None:
        # learned input states of layer 1 beside the embedding layer's output, pretrained with
        # the encoder: depth 0 (as BEiT's layer decay puts its [CLS] token and position table),
        # not the top rate that no prefix gave them. An explicit embedding_lr is the piece
        # table's lever and stays the embedding layer's.
        rates[names[id(encoder.memory_tokens)]] = lr * ft.layer_decay**depth
    return rates


def train_one_seed(
    model: Classifier,
    x_train: Sequence[Sequence[int]],
    y_train: Sequence[int],
    x_val: Sequence[Sequence[int]],
    y_val: Sequence[int],
    ft: FinetuneConfig,
    seed: int,
    run: Any,
    engine_cfg: EngineConfig | None = None,
    labels: Sequence[str] = (),
    on_epoch: Callable[[int], None] | None = None,
    mlm: tuple[MlmHead, TokenMasker] | None = None,
    resegment: SampledSegmentation | None = None,
    hide: InputMasker | None = None,
) -> SeedTraining:
    """Train on the one loop until validation macro-F1 stops improving (`ft.patience`
    epochs) or `ft.epochs` end; the best epoch's weights are restored into `model`.

    The best epoch's validation metrics come back with it (names: `labels`, default the class
    ids), so the split is not scored again. `run` gets the loop's metrics: train/loss,
    train/accuracy, lr and tokens_per_s per epoch, eval/macro_f1 and eval/accuracy
    (validation) per epoch, with the optimizer step as the MLflow step.
    """
    from tibnlp.training.engine import init_distributed
    from tibnlp.training.loop import LoopSettings
    from tibnlp.training.wiring import start_training

    _check_device(ft.device)
    per_epoch = len(x_train) // ft.batch_size
    if per_epoch == 0:
        raise DataError(
            f"{len(x_train)} training examples, fewer than one batch "
            f"(finetune.batch_size={ft.batch_size})",
            "lower finetune.batch_size or use more training data (finetune.limit_train)",
        )
    total = per_epoch * ft.epochs
    opt = ft.optimizer
    optimizer = dataclasses.replace(
        opt, warmup_steps=opt.warmup_steps or round(ft.warmup_ratio * total)
    )
    engine_cfg = engine_cfg or EngineConfig()
    world = init_distributed(engine_cfg)
    head, masker = mlm if mlm is not None else (None, None)
    training = start_training(
        ClassifierLoss(
            model,
            head,
            ft.mlm_weight,
            class_weights(y_train, model.num_labels, ft.class_balance),
            ft.adversarial,
            ft.l2sp,
        ),
        engine_cfg,
        optimizer,
        ft.batch_size,
        0,
        total,
        world,
        learning_rates(model, ft),
    )
    scored: list[Metrics] = []  # one per evaluation, in order

    def evaluate() -> dict[str, float]:
        probs = predict_proba(model, x_val, ft.eval_batch_size, routing=ft.eval_routing)
        names = list(labels) or [str(i) for i in range(probs.shape[1])]  # every class counts
        scored.append(compute_metrics(y_val, probs.argmax(axis=1).tolist(), names))
        return {"macro_f1": scored[-1]["macro_f1"], "accuracy": scored[-1]["accuracy"]}

    settings = LoopSettings(
        max_steps=total,
        log_every=per_epoch,
        eval_every=per_epoch,
        eval_batches=0,
        checkpoint_every=0,
        keep_checkpoints=0,
        checkpoint_dir=Path(),
        progress_label=f"seed {seed}",
        select="macro_f1",
        patience=ft.patience,
    )
    batches = epoch_batches(
        x_train, y_train, ft.batch_size, seed, training, on_epoch, masker, resegment, hide
    )
    result = training.loop(batches, None, settings, evaluate).run(run)
    best_epoch = result.best_step // per_epoch
    return SeedTraining(best_epoch, math.ceil(result.step / per_epoch), scored[best_epoch - 1])
