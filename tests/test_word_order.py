"""The word-order probe: shuffled batches, the two accuracies, and the pretraining warning."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
from torch import nn

from tibnlp.evaluation.word_order import is_order_blind, order_accuracies, shuffle_order
from tibnlp.training.learning_check import LearningCheck
from tibnlp.training.loop import Progress

V = 12  # vocabulary of the stub models


def _batch() -> dict[str, torch.Tensor]:
    """Rows `[CLS] a a b b c c ...` with every second piece of a pair masked (label = the piece,
    input = [MASK] id 1): the left neighbour always tells the answer. Row 1 is padded."""
    rows, labels, masks = [], [], []
    for row, length in enumerate((11, 7)):
        ids = [2] + [3 + (i // 2 + row) % (V - 3) for i in range(length - 1)]
        lab = [-100] * length
        for i in range(2, length, 2):
            lab[i], ids[i] = ids[i], 1
        pad = 11 - length
        rows.append(ids + [0] * pad)
        labels.append(lab + [-100] * pad)
        masks.append([1] * length + [0] * pad)
    ids = torch.tensor(rows)
    return {
        "input_ids": ids,
        "attention_mask": torch.tensor(masks),
        "token_type_ids": torch.zeros_like(ids),
        "mlm_labels": torch.tensor(labels),
    }


class _Stub(nn.Module):
    """An `AlbertForPretraining` stand-in: `encoder` gives each position a one-hot of its left
    neighbour (order-aware) or of the row's most frequent real piece (a bag of pieces);
    `mlm_logits` reads the one-hot as the prediction."""

    def __init__(self, order_aware: bool) -> None:
        super().__init__()
        self.order_aware = order_aware
        self.encoder = self._encode

    def _encode(self, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor | None):
        if self.order_aware:
            left = torch.cat([ids[:, :1], ids[:, :-1]], dim=1)
        else:
            real = ids.masked_fill((mask == 0) | (ids < 3), 0)
            counts = torch.stack([torch.bincount(r, minlength=V) for r in real])
            counts[:, 0] = 0
            left = counts.argmax(-1, keepdim=True).expand_as(ids)
        return SimpleNamespace(hidden=nn.functional.one_hot(left, V).float())

    def mlm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden


def test_shuffle_keeps_cls_padding_and_moves_labels_with_their_pieces() -> None:
    batch = _batch()
    original = {k: v.clone() for k, v in batch.items()}
    out = shuffle_order(batch, seed=3)
    assert all(torch.equal(batch[k], original[k]) for k in batch)  # the input is not changed
    assert torch.equal(out["input_ids"][:, 0], batch["input_ids"][:, 0])  # [CLS] stays
    assert torch.equal(out["attention_mask"], batch["attention_mask"])
    assert torch.equal(out["input_ids"][1, 7:], batch["input_ids"][1, 7:])  # padding stays
    assert not torch.equal(out["input_ids"], batch["input_ids"])

    def pairs(b: dict[str, torch.Tensor], row: int) -> list[tuple[int, int]]:
        return sorted(zip(b["input_ids"][row].tolist(), b["mlm_labels"][row].tolist(), strict=True))

    for row in range(2):
        assert pairs(out, row) == pairs(batch, row)  # each piece keeps its label


def test_order_accuracies_tell_an_order_aware_model_from_a_bag_of_pieces() -> None:
    batches = [_batch()]
    aware = order_accuracies(_Stub(order_aware=True), batches)
    assert aware[0] == 1.0 and aware[1] < 0.5
    assert not is_order_blind(*aware, unigram=0.1)
    bag = order_accuracies(_Stub(order_aware=False), batches)
    assert bag[0] == bag[1]
    assert is_order_blind(bag[0] + 0.2, bag[1] + 0.2, unigram=0.1)
    unmasked = {**batches[0], "mlm_labels": torch.full_like(batches[0]["mlm_labels"], -100)}
    none = order_accuracies(_Stub(order_aware=True), [unmasked])  # nothing measured: NaN
    assert all(math.isnan(x) for x in none) and not is_order_blind(*none, unigram=0.1)


class _Tracker:
    def __init__(self) -> None:
        self.tags: dict[str, str] = {}
        self.metrics: dict[str, float] = {}

    def set_tags(self, tags: dict[str, str]) -> None:
        self.tags.update(tags)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.metrics.update(metrics)


def _check(probe_result: tuple[float, float], capsys) -> tuple[_Tracker, str, int]:  # type: ignore[no-untyped-def]
    calls = []

    def probe() -> tuple[float, float]:
        calls.append(1)
        return probe_result

    check = LearningCheck(0.02, 0.25, lambda at: at.step / 100, probe)
    check.tracker = _Tracker()  # type: ignore[assignment]
    check(Progress(10, 0, 0), {"mask_accuracy": 0.11})  # too early: no probe
    assert not calls
    check(Progress(30, 0, 0), {"mask_accuracy": 0.11})
    check(Progress(40, 0, 0), {"mask_accuracy": 0.11})  # probed once only
    return check.tracker, capsys.readouterr().err, len(calls)  # type: ignore[return-value]


def test_pretraining_warns_when_the_model_ignores_word_order(capsys) -> None:  # type: ignore[no-untyped-def]
    # the measured case: 11.35 % as written, 10.95 % shuffled, unigram 2 %
    tracker, err, calls = _check((0.1135, 0.1095), capsys)
    assert calls == 1 and tracker.tags["warning"] == "order_blind"
    assert tracker.metrics == {"eval/order_accuracy": 0.1135, "eval/shuffled_accuracy": 0.1095}
    assert "ignores word order" in err and "model.position=relative" in err


def test_no_order_warning_for_a_model_that_reads_the_sentence(capsys) -> None:  # type: ignore[no-untyped-def]
    tracker, err, calls = _check((0.20, 0.11), capsys)
    assert calls == 1 and "warning" not in tracker.tags and err == ""
    assert tracker.metrics["eval/shuffled_accuracy"] == 0.11
