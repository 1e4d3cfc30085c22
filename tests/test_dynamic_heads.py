"""DMA-ALBERT routing (MODELS.md section 2): the mechanism, pinned."""

from __future__ import annotations

import pytest
import torch

from tibnlp.config.model import HeadsConfig, ModelConfig
from tibnlp.errors import ConfigError
from tibnlp.models import AlbertForPretraining, Encoder
from tibnlp.models.attention import choose_large

D = 24


def cfg_for(small: int, large: int, threshold: int | str = 5, rule: str = "batch") -> ModelConfig:
    return ModelConfig(
        vocab_size=40,
        embedding_size=8,
        hidden_size=D,
        num_layers=2,
        ffn_size=32,
        max_len=32,
        dropout=0.0,
        attention_dropout=0.0,
        heads=HeadsConfig(small=small, large=large, threshold=threshold, rule=rule),  # type: ignore[arg-type]
    )


def batch(lengths: list[int], n: int | None = None, seed: int = 0):  # type: ignore[no-untyped-def]
    n = n or max(lengths)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 40, (len(lengths), n), generator=g)
    mask = (torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]).long()
    return ids * mask, mask


@pytest.mark.parametrize("b,m", [(1, 5), (4, 5), (3, 7)])
def test_batch_rule_switches_exactly_at_threshold(b: int, m: int) -> None:
    heads = HeadsConfig(small=4, large=6, threshold=m, rule="batch")
    at = torch.full((b,), m)  # sum = m * B: small
    above = at.clone()
    above[0] += 1  # sum = m * B + 1: large
    assert not choose_large(at, heads).any()
    assert choose_large(above, heads).all()


def test_sentence_rule_decides_per_sequence() -> None:
    heads = HeadsConfig(small=4, large=6, threshold=5, rule="sentence")
    assert choose_large(torch.tensor([5, 6, 1, 9]), heads).tolist() == [False, True, False, True]
    fixed = HeadsConfig(small=6, large=6, threshold=5)
    assert not choose_large(torch.tensor([50, 60]), fixed).any()


def test_encoder_reports_route_share() -> None:
    enc = Encoder(cfg_for(4, 6, 5, "sentence")).eval()
    ids, mask = batch([3, 8, 9, 2])
    out = enc(ids, mask)
    assert out.large.tolist() == [False, True, True, False]
    assert out.route_large_fraction.item() == 0.5


def test_batch_rule_one_at_a_time_equals_sentence_rule() -> None:
    torch.manual_seed(0)
    batch_model = Encoder(cfg_for(4, 6, 5, "batch")).eval()
    sentence_model = Encoder(cfg_for(4, 6, 5, "sentence")).eval()
    sentence_model.load_state_dict(batch_model.state_dict())
    lengths = [3, 8, 5, 6, 2]
    ids, mask = batch(lengths)
    mixed = sentence_model(ids, mask)
    assert mixed.large.tolist() == [n > 5 for n in lengths]
    for i, n in enumerate(lengths):
        alone = batch_model(ids[i : i + 1, :n], mask[i : i + 1, :n])
        assert alone.large.item() == (n > 5)
        torch.testing.assert_close(alone.hidden[0], mixed.hidden[i, :n], rtol=1e-5, atol=1e-5)


def _grads(model: AlbertForPretraining, heads: int) -> list[torch.Tensor | None]:
    return [p.grad for p in model.encoder.layer.attention.route(heads).parameters()]


@pytest.mark.parametrize("lengths,used", [([2, 3, 5], 4), ([9, 3, 5], 6)])
def test_only_the_used_route_gets_gradients(lengths: list[int], used: int) -> None:
    model = AlbertForPretraining(cfg_for(4, 6, 5, "batch"))
    ids, mask = batch(lengths, 10)
    labels = torch.full_like(ids, -100)
    labels[:, 1] = ids[:, 1]
    model(ids, mask, None, labels, torch.tensor([0, 1, 0]))["loss"].backward()
    other = 6 if used == 4 else 4
    assert all(g is not None and g.abs().sum() > 0 for g in _grads(model, used))
    assert all(g is None for g in _grads(model, other))


def test_mixed_batch_trains_both_routes_and_each_only_on_its_rows() -> None:
    model = AlbertForPretraining(cfg_for(4, 6, 5, "sentence"))
    ids, mask = batch([9, 3], 10)
    labels = torch.full_like(ids, -100)
    labels[:, 1] = ids[:, 1]
    model(ids, mask, None, labels, torch.tensor([0, 1]))["loss"].backward()
    assert all(g is not None for g in _grads(model, 4) + _grads(model, 6))
    # Alone, the short row reaches the small route only.
    alone = AlbertForPretraining(cfg_for(4, 6, 5, "sentence"))
    alone.load_state_dict(model.state_dict())
    out = alone(ids[1:, :3], mask[1:, :3], None, labels[1:, :3], torch.tensor([1]))
    out["loss"].backward()
    assert all(g is None for g in _grads(alone, 6))


def test_fixed_heads_is_the_special_case() -> None:
    fixed = Encoder(cfg_for(4, 4)).eval()
    assert list(fixed.layer.attention.routes) == ["h4"]
    dynamic = Encoder(cfg_for(4, 6, 5, "batch")).eval()
    assert list(dynamic.layer.attention.routes) == ["h4", "h6"]
    # The fixed model's weights load into the dynamic one (only the new route is missing)
    # and give the same result on every batch that takes the small route.
    missing, unexpected = dynamic.load_state_dict(fixed.state_dict(), strict=False)
    assert not unexpected and all(".routes.h6." in k for k in missing)
    ids, mask = batch([3, 5, 2])
    torch.testing.assert_close(dynamic(ids, mask).hidden, fixed(ids, mask).hidden)


def test_auto_threshold_is_refused_for_dynamic_models() -> None:
    with pytest.raises(ConfigError, match=r"model\.heads\.threshold"):
        Encoder(cfg_for(4, 6, "auto"))
    Encoder(cfg_for(6, 6, "auto"))  # fixed heads never read it


def test_eval_routing_per_text_follows_each_texts_own_length() -> None:
    """`finetune.eval_routing: per_text` on a batch-rule model: each text takes the route of
    its own length (the batch's mean would send all four to the large route) and gets the
    prediction it gets when scored alone; outside evaluation the batch rule is back."""
    from tibnlp.config import load_config
    from tibnlp.evaluation.predict import predict_proba
    from tibnlp.models.attention.dynamic import per_text_routing
    from tibnlp.models.classifier import Classifier

    torch.manual_seed(0)
    model = Classifier(Encoder(cfg_for(4, 6, 5, "batch")), 3, "linear").eval()
    lengths = [3, 8, 9, 2]  # sum 22 > 5 * 4: the batch rule routes all four large
    ids, mask = batch(lengths)
    assert model.encoder(ids, mask).large.all()
    with per_text_routing(model) as switched:
        assert switched == 1
        assert model.encoder(ids, mask).large.tolist() == [n > 5 for n in lengths]
    assert model.encoder(ids, mask).large.all()

    texts = [row[:n].tolist() for row, n in zip(ids, lengths, strict=True)]
    routing = load_config(overrides=["finetune.eval_routing=per_text"]).finetune.eval_routing
    per_text = predict_proba(model, texts, batch_size=4, routing=routing)
    alone = predict_proba(model, texts, batch_size=1)  # the batch rule, one text at a time
    batched = predict_proba(model, texts, batch_size=4)
    assert abs(per_text - alone).max() < 1e-5
    assert abs(batched - alone)[[0, 3]].max() > 1e-3  # short texts routed large in a batch
    assert abs(batched - alone)[[1, 2]].max() < 1e-5


def test_finetuning_reports_the_large_route_share() -> None:
    """The fine-tuning loss hands the loop `route_large_fraction` (logged per epoch as
    train/route_large_fraction): the batch rule's share of large-route batches."""
    from tibnlp.models.classifier import Classifier, EmbeddingEncoder
    from tibnlp.training.classification import ClassifierLoss

    torch.manual_seed(0)
    loss = ClassifierLoss(Classifier(Encoder(cfg_for(4, 6, 5, "batch")), 3, "linear"))
    labels = torch.tensor([0, 1, 2, 0])
    assert loss(*batch([8, 9, 7, 2]), labels)["route_large_fraction"].item() == 1.0
    assert loss(*batch([3, 4, 5, 6]), labels)["route_large_fraction"].item() == 0.0
    plain = ClassifierLoss(Classifier(EmbeddingEncoder(40, 8), 3, "cnn", kernels=[1]))
    assert "route_large_fraction" not in plain(*batch([3, 4, 5, 6]), labels)
