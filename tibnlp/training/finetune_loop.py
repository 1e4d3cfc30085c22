"""The fine-tuning loop: AdamW with warmup and decay, epochs, validation macro-F1, early stop.

Kept apart from the orchestration in `finetune.py` so that it can move onto the shared
step/eval/log loop (`training/loop.py`) as one piece: what is specific to fine-tuning here is
the batches (`batches`), the loss (cross-entropy on logits) and the selection metric.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np
import torch
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from torch import nn

from tibnlp.config.finetune import FinetuneConfig
from tibnlp.config.train import OptimizerConfig
from tibnlp.data.collate import pad_batch
from tibnlp.evaluation.metrics import compute_metrics
from tibnlp.evaluation.predict import predict_proba


class MetricLogger(Protocol):
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None: ...


def pick_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def batches(
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
    run: MetricLogger,
) -> tuple[int, int]:
    """Train until validation macro-F1 stops improving; restore the best state in place.

    Returns (best epoch, epochs run), both 1-based.
    """
    opt = ft.optimizer
    device = next(model.parameters()).device  # the caller places the model (see pick_device)
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
    with Progress(*columns, transient=True, console=Console(stderr=True)) as progress:
        for epoch in range(1, ft.epochs + 1):
            model.train()
            bar = progress.add_task(f"seed {seed} epoch {epoch}", total=steps_per_epoch, rate="")
            losses: list[float] = []
            started = time.monotonic()
            for input_ids, mask, target in batches(x_train, y_train, ft.batch_size, rng):
                logits = model(input_ids.to(device), mask.to(device))
                loss = loss_fn(logits, target.to(device))
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
            progress.console.log(
                f"seed {seed} epoch {epoch}: train loss {np.mean(losses):.4f}, "
                f"validation macro-F1 {100 * val_f1:.2f}"
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
