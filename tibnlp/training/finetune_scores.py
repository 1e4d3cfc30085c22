"""A fine-tuned classifier's scores on every part of its run: validation, test (with the
unseen items and the suffix flip rates) and the extra test sets (`finetune.eval_also`).
Apart from the seed's record (`finetune_seeds.py`), which scores a finished seed again with
them: a seed trained now and one reported later are scored alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from tibnlp.config.finetune import FinetuneConfig
from tibnlp.data.collate import encode_counting_cuts
from tibnlp.data.labelled import LabelledSet, model_text
from tibnlp.evaluation.metrics import Metrics, compute_metrics
from tibnlp.evaluation.predict import predict_proba
from tibnlp.evaluation.robustness import suffix_flip_rates
from tibnlp.models.classifier_io import read_length
from tibnlp.training.finetune_setup import Setup
from tibnlp.training.finetune_splits import cut_summary, texts

# the parts each extra test set (`finetune.eval_also`) adds to a seed's metrics, by the split
# of the set each scores
EXTRA_PARTS = {"advts": {"advts_original": "original", "advts": "adversarial"}}


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
    predict = _predictor(setup, ft, model)

    def evaluate(x: Sequence[Sequence[int]], y: Sequence[int]) -> Metrics:
        return compute_metrics(y, predict(x), labels)

    def predict_raw(texts: list[str]) -> tuple[list[int], list[int]]:
        """As `tibnlp predict` receives them; with the pieces each lost to the cut."""
        read, join = read_length(setup.meta), setup.meta.join_spaced_syllables
        model_texts = [model_text(t, ft.text_form, join) for t in texts]
        ids, dropped = encode_counting_cuts(setup.vocab, model_texts, read)
        return predict(ids), dropped

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
    return {**metrics, **score_extra(setup, ft, model, advts)}


def _predictor(
    setup: Setup, ft: FinetuneConfig, model: torch.nn.Module
) -> Callable[[Sequence[Sequence[int]]], list[int]]:
    """The classifier's predicted classes of encoded texts, as every part is scored."""

    def predict(x: Sequence[Sequence[int]]) -> list[int]:
        probs = predict_proba(model, x, ft.eval_batch_size, setup.vocab.pad_id, ft.eval_routing)
        return probs.argmax(1).tolist()

    return predict


def score_extra(
    setup: Setup, ft: FinetuneConfig, model: torch.nn.Module, advts: LabelledSet | None
) -> dict[str, Metrics]:
    """A trained classifier's metrics on the extra test sets (AdvTS's two parts); {}: none."""
    if advts is None:
        return {}
    predict = _predictor(setup, ft, model)
    return {
        part: compute_metrics(
            advts.targets(split), predict(encoded_split(setup, advts, split)), setup.data.labels
        )
        for part, split in EXTRA_PARTS["advts"].items()
    }


def encoded_split(setup: Setup, data: LabelledSet, split: str) -> list[list[int]]:
    """A split of another set (AdvTS) as the classifier reads it."""
    return _encoded_counting_cuts(setup, data, split)[0]


def _encoded_counting_cuts(
    setup: Setup, data: LabelledSet, split: str
) -> tuple[list[list[int]], list[int]]:
    """`encoded_split`, and the pieces each text lost to the cut at the read length."""
    return encode_counting_cuts(
        setup.vocab, texts(data, split, setup.meta.text_form), read_length(setup.meta)
    )


def advts_cut(setup: Setup, advts: LabelledSet | None) -> dict[str, tuple[int, dict[str, int]]]:
    """Per AdvTS part, as its scores are named: its size and what the cut at the read length
    took from it (`cut_summary`), as `Setup.cut` has it for the run's own splits: a score read
    from cut texts is not the score of the whole texts."""
    if advts is None:
        return {}
    return {
        part: (
            len(advts.splits[split]),
            cut_summary(_encoded_counting_cuts(setup, advts, split)[1]),
        )
        for part, split in EXTRA_PARTS["advts"].items()
    }
