"""Fine-tuning a model soup (`finetune.soup`): the copies of one seed, kept as they finish so
a killed run resumes, and the greedy soup of them scored on validation.

The weight arithmetic is `tibnlp.training.soup`; this module runs the copies with the
fine-tuning's own training function and keeps them on disk.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tibnlp.config.finetune import FinetuneConfig
from tibnlp.evaluation.metrics import Metrics, compute_metrics
from tibnlp.evaluation.predict import predict_proba
from tibnlp.fsutil import atomic_file
from tibnlp.tracking import PrefixedRun, Tracker
from tibnlp.training.classification import set_seed
from tibnlp.training.finetune_setup import Setup
from tibnlp.training.ranks import from_main
from tibnlp.training.soup import greedy_soup

SOUP_SALT = 1000  # the copies of seed s fine-tune with seeds s * SOUP_SALT + 1, + 2, ...
SOUP_DIR = "soup-copies"  # finished copies of a soup, inside the seed's folder until it is saved


@dataclass
class SoupCopy:
    """One fine-tuned copy of a soup: its weights, validation macro-F1 and epochs."""

    state: dict[str, torch.Tensor]
    score: float
    best_epoch: int
    epochs_run: int


def fine_tune_copies(
    train: Callable[[int, Any, Any], tuple[int, int, Metrics]],
    aux_mlm: Callable[[int], Any],
    model: torch.nn.Module,
    count: int,
    seed: int,
    run: Tracker,
    directory: Path,
    key: str,
    main: bool = True,
) -> list[SoupCopy]:
    """Fine-tune the `finetune.soup` copies of one seed from `model`'s current weights.

    `train(seed, run, mlm)` is the fine-tuning's training call with the model, data and
    recipe bound; `aux_mlm(seed)` its MLM beside (or None). Copy 0 is the plain
    fine-tuning (it goes on from the seed's random state); copy k starts again from the same
    weights with seed `seed * SOUP_SALT + k`. Each finished copy is kept in
    `directory/soup-copies` under `key` (removed when the classifier is saved there), so a
    killed run resumes at the copy it was training: the copies are reseeded, so they do not
    depend on the ones before. `main`: this process reads and writes the kept copies (rank 0
    of a data-parallel run; the others take what it found, `ranks.from_main`)."""
    start = copy.deepcopy(model.state_dict())
    copies: list[SoupCopy] = []
    for index in range(count):
        path = directory / SOUP_DIR / f"copy-{index}.pt"
        done = from_main(_load_copy(path, key) if main else None, f"look for {path}")
        if done is not None:
            if main:
                print(f"soup: copy {index} of seed {seed} was fine-tuned before", file=sys.stderr)
            copies.append(done)
            continue
        copy_seed = seed if index == 0 else seed * SOUP_SALT + index
        if index:
            model.load_state_dict(start)
            set_seed(copy_seed)
        best_epoch, epochs_run, validation = train(
            copy_seed, PrefixedRun(run, f"soup{index}/"), aux_mlm(copy_seed)
        )
        state = {k: v.detach().clone().cpu() for k, v in model.state_dict().items()}
        copies.append(SoupCopy(state, validation["macro_f1"], best_epoch, epochs_run))
        if main:
            with atomic_file(path) as tmp:
                torch.save({"key": key, **dataclasses.asdict(copies[-1])}, tmp)
    return copies


def _load_copy(path: Path, key: str) -> SoupCopy | None:
    """A copy kept by an earlier run with the same settings, weights and data; else None."""
    if not path.is_file():
        return None
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # a damaged file (the rename makes it rare): train the copy again
        return None
    if not isinstance(saved, dict) or saved.get("key") != key:
        return None
    return SoupCopy(saved["state"], saved["score"], saved["best_epoch"], saved["epochs_run"])


def cook_soup(
    model: torch.nn.Module,
    copies: list[SoupCopy],
    setup: Setup,
    ft: FinetuneConfig,
    run: Tracker,
) -> Metrics:
    """Load the greedy soup of the copies into `model`; log how many it holds and its
    validation score; return its validation metrics."""
    x_val, y_val = setup.ids["validation"], setup.data.targets("validation")

    def validation_of(state: dict[str, torch.Tensor]) -> Metrics:
        model.load_state_dict(state)
        probs = predict_proba(model, x_val, ft.eval_batch_size, setup.vocab.pad_id, ft.eval_routing)
        return compute_metrics(y_val, probs.argmax(1).tolist(), setup.data.labels)

    states, scores = [c.state for c in copies], [c.score for c in copies]
    soup, kept, _ = greedy_soup(states, scores, lambda s: validation_of(s)["macro_f1"])
    validation = validation_of(soup)
    run.log_metrics(
        {
            "soup/copies_kept": float(len(kept)),
            "soup/best_copy_val_macro_f1": max(scores),
            "soup/val_macro_f1": validation["macro_f1"],
        }
    )
    print(
        f"soup: {len(kept)} of {len(states)} copies kept (validation macro-F1 "
        f"{100 * validation['macro_f1']:.2f}; best copy {100 * max(scores):.2f})",
        file=sys.stderr,
    )
    return validation
