"""Same-document contrast beside MLM (`pretrain.contrastive`): split rows, the loss, refusals
(a pretraining run with it: `test_pretrain.py`)."""

from __future__ import annotations

import math
import random

import pytest
import torch
from design_models import tiny
from test_masking import CLS, IDS, SEP, _example

from tibnlp.config import load_config
from tibnlp.data.masking import IGNORE_INDEX, MlmCollator
from tibnlp.errors import ConfigError, DataError
from tibnlp.models.pretraining import AlbertForPretraining


def test_split_pairs_makes_two_rows_per_example_with_their_columns() -> None:
    rng = random.Random(3)
    examples = [_example(rng, 5 + i, 9 - i) for i in range(4)]
    batch = MlmCollator(IDS, mask_prob=0.3, seed=1, split_pairs=True)(examples, 0)
    assert batch["input_ids"].shape[0] == 8
    for i, ex in enumerate(examples):
        cut = ex["input_ids"].index(SEP) + 1
        want = [ex["input_ids"][:cut], [CLS, *ex["input_ids"][cut:]]]
        for j, ids in enumerate(want):
            row = 2 * i + j
            n = int(batch["attention_mask"][row].sum())
            assert n == len(ids)
            labels = batch["mlm_labels"][row, :n]
            original = torch.where(labels != IGNORE_INDEX, labels, batch["input_ids"][row, :n])
            # unmasked tokens as they were; masked ones are the labels: the row is its segment
            kept = labels == IGNORE_INDEX
            assert original[kept].tolist() == [t for t, k in zip(ids, kept, strict=True) if k]
            assert original[~kept].tolist() == labels[~kept].tolist()
            assert int(original[0]) == CLS and int(original[n - 1]) == SEP
            assert labels[0] == IGNORE_INDEX and labels[n - 1] == IGNORE_INDEX
            assert not batch["token_type_ids"][row].any()


def test_split_pairs_refuses_an_example_without_a_middle_sep() -> None:
    bad = {"input_ids": [CLS, 7, 8, SEP], "syllable_start": [True] * 4, "sop_label": 0}
    with pytest.raises(DataError, match="no \\[SEP\\] between"):
        MlmCollator(IDS, split_pairs=True)([bad], 0)


def _model(weight: float) -> AlbertForPretraining:
    torch.manual_seed(0)  # relative positions, the CPU recipe's: the last layer runs whole
    cfg = tiny(vocab_size=IDS.size, position="relative", initializer_range=0.02)
    return AlbertForPretraining(cfg, sop=False, contrastive=weight)


def test_contrast_adds_to_mlm_and_picks_partners() -> None:
    model = _model(0.5)
    rng = random.Random(5)
    batch = MlmCollator(IDS, mask_prob=0.3, seed=1, split_pairs=True)(
        [_example(rng, 12, 12) for _ in range(6)], 0
    )
    batch.pop("sop_labels")
    out = model(**batch)
    assert torch.allclose(out["loss"], out["mask_loss"] + 0.5 * out["contrastive_loss"])
    assert 0.0 <= float(out["contrastive_accuracy"]) <= 1.0
    # identical partners, distinct documents: every row finds its partner, under chance loss
    rows = torch.randint(5, IDS.size, (4, 10), generator=torch.Generator().manual_seed(0))
    ids = rows.repeat_interleave(2, dim=0)
    with torch.no_grad():
        hidden = model.encoder(ids, torch.ones_like(ids), None).hidden
        loss, accuracy = model.same_document(hidden, torch.ones_like(ids))
    assert float(accuracy) == 1.0 and float(loss) < math.log(7)
    # the loss reaches the encoder
    out["loss"].backward()
    assert model.encoder.embeddings.word.weight.grad is not None
    assert model.contrastive_proj.weight.grad.abs().sum() > 0


def test_contrast_needs_row_pairs_and_no_sop() -> None:
    model = _model(1.0)
    odd = torch.ones((3, 4))
    with pytest.raises(ValueError, match="row pairs"):
        model.same_document(torch.zeros((3, 4, 32)), odd)
    with pytest.raises(ValueError, match="no SOP"):
        AlbertForPretraining(model.cfg, sop=True, contrastive=1.0)
    with pytest.raises(ConfigError, match=r"pretrain.contrastive"):
        load_config(None, ["pretrain.contrastive=1.0"])  # sop is on by default
    with pytest.raises(ConfigError, match=r"pretrain.contrastive"):
        load_config(None, ["pretrain.contrastive=-1", "pretrain.sop=false"])
    with pytest.raises(ConfigError, match=r"pretrain.contrastive_temperature"):
        load_config(None, ["pretrain.contrastive_temperature=0"])
