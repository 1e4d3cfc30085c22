"""Optimizers as plain torch code: DeepSpeed's fused Adam/LAMB need compiled ops (and a GPU),
so the engine gets a client optimizer that runs anywhere."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from tibnlp.config.train import OptimizerConfig


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al. 2020, arXiv:1904.00962): Adam's update rescaled per tensor by the trust
    ratio ||w|| / ||update||, so large batches train with one lr across layers of any scale.
    Bias-corrected moments; weight decay inside the update (as in the paper's Algorithm 2);
    the trust ratio is 1 where either norm is 0."""

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
    ) -> None:
        if lr <= 0 or eps < 0 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError("Lamb: lr must be > 0, eps >= 0, betas in [0, 1)")
        super().__init__(
            params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        )

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad.float()
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
                state["step"] += 1
                step = state["step"].item()
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                m_hat = m / (1 - beta1**step)
                v_hat = v / (1 - beta2**step)
                update = m_hat / (v_hat.sqrt() + group["eps"])
                weight = p.float()
                if group["weight_decay"]:
                    update.add_(weight, alpha=group["weight_decay"])
                w_norm, u_norm = weight.norm(), update.norm()
                trust = torch.where(
                    (w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm)
                )
                p.add_((update * trust).to(p.dtype), alpha=-group["lr"])
        return loss


def param_groups(
    model: nn.Module, weight_decay: float, lr_by_prefix: Mapping[str, float] | None = None
) -> list[dict]:
    """No weight decay on biases and normalisation weights (1-d tensors), as BERT/ALBERT do.

    `lr_by_prefix` gives parameters whose name starts with a prefix (e.g. "model.head.") their
    own learning rate (a fine-tuning head beside a pretrained encoder); the others keep the
    optimizer's. The schedule scales every group by the same factor.
    """
    prefixes = {p: lr for p, lr in (lr_by_prefix or {}).items() if lr > 0}
    # (lr, decays) -> parameters; the optimizer's own lr first, decay then no decay, so that
    # without prefixes the groups are the two they always were (checkpoints keep loading)
    buckets: dict[tuple[float | None, bool], list[nn.Parameter]] = {
        (None, True): [],
        (None, False): [],
    }
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        lr = next((v for k, v in prefixes.items() if name.startswith(k)), None)
        buckets.setdefault((lr, p.ndim > 1), []).append(p)
    groups = []
    for (lr, decays), params in buckets.items():
        if not params:  # e.g. every matrix under a prefix (DeepSpeed drops empty groups, and
            continue  # the schedule would then count one group too many)
        group: dict = {"params": params, "weight_decay": weight_decay if decays else 0.0}
        if lr is not None:
            group["lr"] = lr
        groups.append(group)
    return groups


def build_optimizer(
    model: nn.Module, cfg: OptimizerConfig, lr_by_prefix: Mapping[str, float] | None = None
) -> torch.optim.Optimizer:
    groups = param_groups(model, cfg.weight_decay, lr_by_prefix)
    betas = (float(cfg.betas[0]), float(cfg.betas[1]))
    if cfg.name == "lamb":
        return Lamb(groups, lr=cfg.lr, betas=betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=betas, eps=cfg.eps)
