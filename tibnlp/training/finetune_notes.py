"""What a fine-tuning run records beside its scores: its notes (input form, recipe, sizes,
what was cut), the pretraining behind its encoder (so a learning curve can place it) and
whether it learned at all (so a collapsed classifier is not read as a result)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from tibnlp.config.finetune import FinetuneConfig
from tibnlp.data.labelled import LabelledSet
from tibnlp.errors import DataError
from tibnlp.evaluation.leakage import unseen_indices
from tibnlp.evaluation.metrics import not_learning
from tibnlp.models.classifier_io import ClassifierMeta, read_length
from tibnlp.models.io import read_extra
from tibnlp.tracking import Tracker
from tibnlp.tracking.conventions import TAG_WARNING, WARNING_MAJORITY
from tibnlp.training.finetune_scores import advts_cut
from tibnlp.training.finetune_setup import Setup
from tibnlp.training.finetune_splits import classes_absent, classes_left_out, texts


def pretraining_of(ft: FinetuneConfig) -> dict[str, Any]:
    """The model directory's pretraining record (`read_extra`: step, tokens, seconds, FLOPs,
    hardware, processes); {} without a directory, or for a baseline whose directory (read for
    its shape or vocabulary only) has no weights file."""
    if not ft.model_dir:
        return {}
    try:
        return read_extra(Path(ft.model_dir))
    except DataError:
        if not ft.random_init:
            raise
        return {}


def warn_if_majority(run: Tracker, system: str, seed: int, score: float, majority: float) -> bool:
    """Say so (a warning line, tag `warning=majority_class`) when a seed's validation macro-F1
    stayed at the majority-class level; True when it did."""
    if not not_learning(score, majority):
        return False
    message = (
        f"{system} seed {seed} is not learning: validation macro-F1 {score:.2%} is at the "
        f"majority-class level ({majority:.2%}): it predicts (nearly) one class; its scores are "
        "not a result (check finetune.optimizer.lr and finetune.epochs)"
    )
    print(f"warning: {message}", file=sys.stderr, flush=True)
    run.set_tags({TAG_WARNING: WARNING_MAJORITY, "warning.detail": message})
    return True


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
        "input_mask": ft.input_mask,
    }


def _untrained(ft: FinetuneConfig) -> str:
    if ft.encoder == "none":
        return "none (TextCNN on piece embeddings from scratch)"
    if ft.model_dir:
        return f"random init with the shape of {ft.model_dir}"
    return "random init (the config's model section)"


def _dataset(data: LabelledSet) -> str:
    """The set as a warning names it: with its folder when it is a user's own."""
    return f"dataset '{data.name}'" + (f" ({data.folder})" if data.folder else "")


def _validation_in_test(ft: FinetuneConfig, data: LabelledSet) -> str:
    """How many validation texts are test texts too, said; warned of when half or more are
    (test.jsonl copied as validation.jsonl: the epochs and recipes chosen on validation are
    then chosen on test, and the test score is optimistic). TNCC's published split has 8."""
    held = texts(data, "validation", ft.text_form)
    both = len(held) - len(unseen_indices(texts(data, "test", ft.text_form), held))
    if held and 2 * both >= len(held):
        print(
            f"warning: {_dataset(data)}: {both} of {len(held)} validation texts are "
            f"also test texts ({ft.text_form} form): what is selected on validation is then "
            "selected on test, and the test score is optimistic (give a validation split of "
            "its own)",
            file=sys.stderr,
            flush=True,
        )
    return f"{both} of {len(held)} validation texts also in test"


def run_notes(
    ft: FinetuneConfig,
    data: LabelledSet,
    setup: Setup,
    unseen: int,
    majority: float,
    advts: LabelledSet | None = None,
) -> dict[str, Any]:
    """The run's notes (tags of its MLflow run, and its results file's "notes"): the input
    form, the recipe, sizes, vocabulary and model, and what was cut or left out, which is
    said on stderr too. `unseen`: the test texts not in train; `majority`: the validation
    macro-F1 of a classifier collapsed onto one class; `advts`: the extra set scored too
    (`finetune.eval_also`), whose cut texts are counted beside the run's own splits."""
    spaces = "syllables joined with U+0F0B" if data.join_spaced_syllables else "words removed"
    notes = {
        "input_form": f"{ft.text_form} (spaces between {spaces}, NFC"
        + (", closing shads and tshegs removed)" if ft.text_form == "tsheg-trimmed" else ")"),
        "recipe": recipe(ft, setup.meta),
        "stored_form": data.source_form,
        "max_len": setup.meta.max_len,
        "sizes": {s: len(v) for s, v in setup.ids.items()},
        "test_unseen": f"{unseen} of {len(data.splits['test'])} test texts not in train",
        "validation_in_test": _validation_in_test(ft, data),
        "vocab": str(setup.vocab_dir),
        "vocab_sha256": setup.vocab.sha256,
        "model": setup.meta.source_model or _untrained(ft),
        **data.notes,  # a folder set's path and where its label list came from
    }
    notes["validation_majority_macro_f1"] = majority
    extra = advts_cut(setup, advts)
    cut = {**setup.cut, **{part: c for part, (_, c) in extra.items()}}
    sizes = {**{s: len(v) for s, v in setup.ids.items()}, **{p: n for p, (n, _) in extra.items()}}
    notes["cut_at_read_length"] = {"read_length": read_length(setup.meta), **cut}
    if unread := ft.unread_settings():
        notes["unread_settings"] = unread
        print(
            f"note: {', '.join(unread)} set, but long_document={ft.long_document} does not read "
            "them (global_memory and memory_selection: memory only; document_max_len: "
            "segments and memory)",
            file=sys.stderr,
            flush=True,
        )
    tests = len(data.splits["test"])
    if tests and not unseen:  # was: noted only, then a crash plotting the empty unseen part
        print(
            f"warning: {_dataset(data)}: 0 of {tests} test texts are unseen: each "
            f"occurs in train ({ft.text_form} form), so the test score is a score on training "
            "texts and there is no unseen score (give test texts that are not in train)",
            file=sys.stderr,
            flush=True,
        )
    if absent := classes_absent(data):
        notes["classes_absent"] = absent
        print(f"note: {absent}", file=sys.stderr, flush=True)
    if left_out := classes_left_out(data, ft.limit_train):
        notes["limit_train"] = left_out
        print(f"warning: {left_out}", file=sys.stderr, flush=True)
    for split, c in cut.items():
        if c["texts"]:  # a document cap (or the window) drops text: say how much, once
            what = f"{split} texts" + ("" if split in setup.cut else " (finetune.eval_also)")
            print(
                f"note: {c['texts']} of {sizes[split]} {what} are longer than "
                f"the read length ({read_length(setup.meta)} tokens); {c['tokens_dropped']} "
                "tokens were cut off and not read",
                file=sys.stderr,
                flush=True,
            )
    return notes
