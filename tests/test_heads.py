"""Classifier heads: TextCNN and linear, padding invariance, freezing, any encoder."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from tibnlp.models.classifier import (
    Classifier,
    EmbeddingEncoder,
    HeadConfig,
    LinearHead,
    TextCNNHead,
    masked_max,
)


class StandInEncoder(nn.Module):
    """Returns `.hidden` like the real encoder's output."""

    def __init__(self, vocab: int = 30, hidden: int = 8) -> None:
        super().__init__()
        self.hidden_size = hidden
        self.emb = nn.Embedding(vocab, hidden, padding_idx=0)
        self.mix = nn.Linear(hidden, hidden)

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        return SimpleNamespace(hidden=torch.tanh(self.mix(self.emb(input_ids))))


def _pad(ids: list[int], n: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.zeros(1, n, dtype=torch.long)
    x[0, : len(ids)] = torch.tensor(ids)
    m = (x != 0).long()
    return x, m


def test_masked_max_ignores_padding() -> None:
    h = torch.tensor([[[1.0], [2.0], [100.0]]])
    assert masked_max(h, torch.tensor([[1, 1, 0]])).item() == 2.0


@pytest.mark.parametrize("head", ["cnn", "linear"])
def test_logits_do_not_depend_on_padding(head: str) -> None:
    torch.manual_seed(0)
    model = Classifier(StandInEncoder(), 4, head, kernels=[2, 3], channels=5).eval()
    ids = [2, 7, 8, 9, 3]
    short = model(*_pad(ids, 5))
    long = model(*_pad(ids, 12))
    assert short.shape == (1, 4)
    torch.testing.assert_close(short, long)


def test_textcnn_uses_every_width_and_max_over_time() -> None:
    torch.manual_seed(0)
    head = TextCNNHead(hidden_size=6, num_labels=3, kernels=[1, 2, 5], channels=4, dropout=0.0)
    assert head.out.in_features == 4 * 3
    hidden = torch.randn(2, 7, 6)
    mask = torch.tensor([[1] * 7, [1, 1, 0, 0, 0, 0, 0]])  # second text shorter than width 5
    logits = head(hidden, mask)
    assert logits.shape == (2, 3) and torch.isfinite(logits).all()
    # changing a padded position of the short text changes nothing
    changed = hidden.clone()
    changed[1, 4:] = 50.0
    torch.testing.assert_close(head(changed, mask), logits)
    # a real token does matter (max-over-time sees it)
    changed[0, 3] = 50.0
    assert not torch.allclose(head(changed, mask)[0], logits[0])


def test_linear_head_cls_and_cls_max() -> None:
    torch.manual_seed(0)
    hidden = torch.randn(1, 5, 4)
    mask = torch.ones(1, 5, dtype=torch.long)
    cls = LinearHead(4, 2, "cls", dropout=0.0)
    other = hidden.clone()
    other[0, 1:] += 3.0
    torch.testing.assert_close(cls(hidden, mask), cls(other, mask))  # [CLS] only
    both = LinearHead(4, 2, "cls_max", dropout=0.0)
    assert both.out.in_features == 8
    assert not torch.allclose(both(hidden, mask), both(other, mask))


def test_frozen_encoder_gets_no_gradient() -> None:
    model = Classifier(StandInEncoder(), 3, HeadConfig(kind="cnn", kernels=[2], channels=3))
    model.freeze_encoder(True)
    x, m = _pad([2, 5, 6, 3], 4)
    model(x, m).sum().backward()
    assert all(p.grad is None for p in model.encoder.parameters())
    assert all(p.grad is not None for p in model.head.parameters())


def test_embedding_encoder_returns_a_plain_tensor() -> None:
    model = Classifier(EmbeddingEncoder(20, 6), 2, "cnn", kernels=[2, 3], channels=4)
    x, m = _pad([2, 5, 6, 3], 6)
    assert model(x, m).shape == (1, 2)


def test_unknown_head_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown head"):
        Classifier(StandInEncoder(), 2, "rnn")


def _head_input(model: Classifier, x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """What the head's first linear layer receives."""
    first = model.head.hidden if model.head.hidden is not None else model.head.out
    seen: list[torch.Tensor] = []
    handle = first.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    model.eval()(x, m)
    handle.remove()
    return seen[0]


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_finetune_pooling_reaches_the_head(kind: str) -> None:
    """`finetune.pooling` (the one pooling setting), from the config to the head's input."""
    from tibnlp.config import load_config
    from tibnlp.models.classifier import head_config

    torch.manual_seed(0)
    x, m = _pad([2, 5, 6, 3], 6)
    inputs = {}
    for pooling in ("cls", "cls_max"):
        ft = load_config(overrides=[f"finetune.head={kind}", f"finetune.pooling={pooling}"])
        torch.manual_seed(1)
        model = Classifier(StandInEncoder(), 3, head_config(ft.finetune, ft.model))
        inputs[pooling] = _head_input(model, x, m)
        hidden = model.encoder(x, m).hidden
    torch.testing.assert_close(inputs["cls"], hidden[:, 0])
    assert inputs["cls_max"].shape == (1, 16)
    torch.testing.assert_close(inputs["cls_max"][:, :8], hidden[:, 0])
    torch.testing.assert_close(inputs["cls_max"][:, 8:], hidden[0, :4].amax(0, keepdim=True))


def test_pooling_with_the_cnn_head_is_refused() -> None:
    from tibnlp.config import load_config
    from tibnlp.errors import ConfigError

    with pytest.raises(ConfigError, match=r"finetune\.pooling"):
        load_config(overrides=["finetune.head=cnn", "finetune.pooling=cls_max"])
    for pooling in ("auto", "cls"):  # neither asks the CNN head for anything
        load_config(overrides=["finetune.head=cnn", f"finetune.pooling={pooling}"])


WINDOWS = "model.scales.windows=['1','3',N/4]"


@pytest.mark.parametrize(
    ("model", "pooling", "expected"),
    [
        ([WINDOWS], "auto", "cls_max"),  # MODELS.md section 3's classification node
        ([], "auto", "cls"),
        ([WINDOWS], "cls", "cls"),  # an explicit setting wins
        ([], "cls_max", "cls_max"),
    ],
)
def test_auto_pooling_follows_the_encoder(model: list[str], pooling: str, expected: str) -> None:
    from tibnlp.config import load_config
    from tibnlp.models.classifier import head_config
    from tibnlp.training.finetune_setup import system_name

    cfg = load_config(overrides=[*model, "finetune.head=linear", f"finetune.pooling={pooling}"])
    head = head_config(cfg.finetune, cfg.model)
    assert head.pooling == expected
    assert system_name(cfg.finetune, head.pooling).endswith(f"+linear-{expected}")


def test_cnn_fine_tunings_keep_their_cache_key_under_auto_pooling() -> None:
    """The default moved from cls to auto; a CNN head never reads it, so its runs' keys stay,
    while a linear head's key tells auto from cls (they differ on multi-scale encoders)."""
    from tibnlp.config import load_config
    from tibnlp.config.core import to_dict
    from tibnlp.config.identity import output_settings

    def key(*sets: str) -> dict:
        return output_settings(to_dict(load_config(overrides=list(sets))), ["finetune"])

    assert key("finetune.head=cnn") == key("finetune.head=cnn", "finetune.pooling=cls")
    assert key("finetune.head=cnn")["finetune"]["pooling"] == "cls"
    linear = key("finetune.head=linear")
    assert linear != key("finetune.head=linear", "finetune.pooling=cls")
    assert linear["finetune"]["pooling"] == "auto"


@pytest.mark.parametrize("model", [[WINDOWS], []])
def test_a_cnn_head_records_cls_pooling_whatever_the_encoder(model: list[str]) -> None:
    """auto resolved to cls_max on a multi-scale encoder for the CNN head too: its
    classifier.yaml named a pooling it never reads, and its seeds' key (which holds the head)
    left the one they had before auto, so finished seeds trained again."""
    from tibnlp.config import load_config
    from tibnlp.models.classifier import head_config

    cfg = load_config(overrides=[*model, "finetune.head=cnn"])
    assert cfg.finetune.pooling == "auto"
    assert head_config(cfg.finetune, cfg.model).pooling == "cls"


def test_mlp_head_is_two_layers_on_cls_and_max() -> None:
    """The multi-scale paper's classifier: [CLS] ++ max-pool -> linear -> ReLU -> linear."""
    torch.manual_seed(0)
    head = LinearHead(4, 3, "cls_max", dropout=0.0, mlp=True).eval()
    assert (head.hidden.in_features, head.hidden.out_features) == (8, 4)
    assert (head.out.in_features, head.out.out_features) == (4, 3)
    hidden = torch.randn(2, 5, 4)
    mask = torch.tensor([[1] * 5, [1, 1, 1, 0, 0]])
    vec = torch.cat([hidden[:, 0], masked_max(hidden, mask)], -1)
    expected = head.out(torch.relu(head.hidden(vec)))
    torch.testing.assert_close(head(hidden, mask), expected)
    padded = hidden.clone()
    padded[1, 3:] = 99.0  # padding never reaches the max-pool
    torch.testing.assert_close(head(padded, mask), expected)
    trained = Classifier(StandInEncoder(), 3, HeadConfig(kind="mlp", pooling="cls_max"))
    x, m = _pad([2, 5, 6, 3], 6)
    trained(x, m).sum().backward()
    assert all(p.grad is not None for p in trained.head.parameters())
