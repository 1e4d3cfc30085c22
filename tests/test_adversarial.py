"""Adversarial training on the piece vectors (`finetune.adversarial`,
`tibnlp.training.adversarial`): the step's size and direction, the loss the loop minimises,
and both encoders it serves (the transformer and the TextCNN baseline's table)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.ft_fixtures import TINY_MODEL
from tibnlp.config import load_config
from tibnlp.errors import ConfigError
from tibnlp.models.classifier import Classifier, EmbeddingEncoder, HeadConfig, head_config
from tibnlp.models.encoder import Encoder
from tibnlp.training.adversarial import (
    adversarial_loss,
    adversarial_step,
    piece_table,
    piece_vectors,
)
from tibnlp.training.classification import ClassifierLoss, probe_recipe


def _tiny_albert(dropout: float = 0.0) -> Classifier:
    cfg = load_config(None, [*TINY_MODEL, "model.vocab_size=40", f"model.dropout={dropout}"])
    cfg.model.attention_dropout = dropout
    torch.manual_seed(0)
    head = HeadConfig("cnn", [2, 3], 8, dropout, layers=[0, -1])
    return Classifier(Encoder(cfg.model), 3, head)


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ids = torch.tensor([[2, 11, 12, 13, 14, 3], [2, 21, 22, 3, 0, 0]])
    return ids, (ids != 0).long(), torch.tensor([0, 2])


def test_step_is_a_share_of_each_texts_norm_along_its_gradient() -> None:
    torch.manual_seed(1)
    vectors = torch.randn(2, 4, 5)
    vectors[1] *= 30.0  # a text of much larger vectors gets a proportionally larger step
    gradient = torch.randn(2, 4, 5)
    real = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    step = adversarial_step(gradient, vectors, real, 0.1)
    assert torch.all(step[1, 2:] == 0)  # padding never moves
    for b, n in ((0, 4), (1, 2)):
        size = vectors[b, :n].norm()
        torch.testing.assert_close(step[b].norm(), 0.1 * size)
        along = step[b, :n].flatten(), gradient[b, :n].flatten()
        cosine = nn.functional.cosine_similarity(*along, dim=0)
        torch.testing.assert_close(cosine, torch.tensor(1.0))
    # a vanishing gradient gives no step, not NaN
    assert torch.all(adversarial_step(torch.zeros(2, 4, 5), vectors, real, 0.1) == 0)


def test_adversarial_batch_raises_the_loss_and_leaves_parameter_grads_alone() -> None:
    model = _tiny_albert()
    ids, mask, labels = _batch()
    table = piece_table(model.encoder)
    assert table is model.encoder.embeddings.word

    def loss_of(logits: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits, labels)

    with piece_vectors(table) as seen:
        logits = model(ids, mask)
    clean = loss_of(logits)
    adversarial = adversarial_loss(
        clean, seen[-1], lambda: model(ids, mask), loss_of, table, mask, 0.05
    )
    torch.testing.assert_close(clean, loss_of(model(ids, mask)))  # the hook is gone again
    torch.testing.assert_close(logits, model(ids, mask))
    # uphill by construction (no dropout here)
    assert float(adversarial.detach()) > float(clean.detach())
    assert all(p.grad is None for p in model.parameters())  # only the step's gradient taken
    (clean + adversarial).backward()
    assert table.weight.grad is not None and bool(table.weight.grad.abs().sum() > 0)


def test_classifier_loss_trains_on_both_batches_and_evaluates_on_one() -> None:
    model = _tiny_albert()
    ids, mask, labels = _batch()
    wrapper = ClassifierLoss(model, adversarial=0.05).train()
    out = wrapper(ids, mask, labels)
    torch.testing.assert_close(out["loss"], out["clean_loss"] + out["adversarial_loss"])
    plain = ClassifierLoss(model).train()(ids, mask, labels)
    torch.testing.assert_close(out["clean_loss"], plain["loss"])
    with torch.no_grad():  # validation: no gradient, so one clean pass
        assert "adversarial_loss" not in wrapper(ids, mask, labels)
    assert "adversarial_loss" not in wrapper.eval()(ids, mask, labels)
    # a frozen encoder (the LP-FT probe) offers no direction: the clean loss alone counts
    model.freeze_encoder(True)
    frozen = wrapper.train()(ids, mask, labels)
    torch.testing.assert_close(frozen["loss"], frozen["clean_loss"])


def test_textcnn_baseline_table_is_perturbed_too() -> None:
    torch.manual_seed(0)
    model = Classifier(EmbeddingEncoder(40, 16, dropout=0.0), 3, HeadConfig("cnn", [2], 8, 0.0))
    assert piece_table(model.encoder) is model.encoder.embeddings
    ids, mask, labels = _batch()
    out = ClassifierLoss(model, adversarial=0.05).train()(ids, mask, labels)
    assert float(out["adversarial_loss"]) > float(out["clean_loss"])


def test_setting_is_validated_named_and_off_in_the_probe() -> None:
    with pytest.raises(ConfigError, match=r"finetune.adversarial"):
        load_config(None, ["finetune.adversarial=-0.1"])
    with pytest.raises(ConfigError, match=r"finetune.adversarial.*truncate"):
        load_config(None, ["finetune.adversarial=0.1", "finetune.long_document=segments"])
    cfg = load_config(None, ["finetune.adversarial=0.1", "finetune.probe_epochs=2"])
    assert probe_recipe(cfg.finetune).adversarial == 0.0
    assert head_config(cfg.finetune, cfg.model).kind == "cnn"
