"""`finetune.layers`: the head reads several encoder states side by side (e.g. the embedding
layer's output beside the last layer's), from the config through training to a saved model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.ft_fixtures import pretrained_env
from tibnlp.config import load_config
from tibnlp.config.model import HeadsConfig, ModelConfig
from tibnlp.errors import ConfigError
from tibnlp.models.classifier import Classifier, HeadConfig
from tibnlp.models.encoder import Encoder


def _encoder(layers: int = 2) -> Encoder:
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=40,
        embedding_size=8,
        hidden_size=8,
        num_layers=layers,
        ffn_size=16,
        max_len=16,
        norm="pre",
        share_layers=False,
        position="relative",
        dropout=0.0,
        attention_dropout=0.0,
        heads=HeadsConfig(small=2, large=2),
    )
    return Encoder(cfg).eval()


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor([[2, 7, 8, 9, 10, 3], [2, 11, 12, 3, 0, 0]])
    return ids, (ids != 0).long()


def test_the_encoder_returns_the_states_asked_for() -> None:
    enc = _encoder()
    ids, mask = _batch()
    out = enc(ids, mask, states=(0, -1, 1, 2))
    zero, last, first, last_again = out.states
    assert torch.equal(last, out.hidden) and torch.equal(last_again, out.hidden)
    embedded = enc.embeddings(ids, torch.zeros_like(ids)) * mask.unsqueeze(-1)
    torch.testing.assert_close(zero, embedded)
    assert not torch.allclose(first, zero) and not torch.allclose(first, last)
    assert zero[1, 4:].abs().sum() == 0 and first[1, 4:].abs().sum() == 0  # padding stays zero
    # asking for states changes nothing else
    torch.testing.assert_close(enc(ids, mask).hidden, out.hidden)
    with pytest.raises(ValueError, match="state 3 does not exist"):
        enc(ids, mask, states=(3,))


def test_the_head_reads_the_embedding_layer_beside_the_last() -> None:
    """With the last layer's state made constant (its final norm zeroed), a head on it alone
    cannot tell two texts apart; one that also reads state 0 can."""
    ids, mask = _batch()
    logits = {}
    for layers in ([-1], [0, -1]):
        enc = _encoder()
        torch.nn.init.zeros_(enc.final_norm.weight)
        torch.nn.init.zeros_(enc.final_norm.bias)
        torch.manual_seed(1)
        model = Classifier(enc, 3, HeadConfig(kind="cnn", kernels=[2], channels=4, layers=layers))
        assert model.head.convs[0].in_channels == 8 * len(layers)
        logits[str(layers)] = model.eval()(ids, mask)
    torch.testing.assert_close(logits["[-1]"][0], logits["[-1]"][1])
    assert not torch.allclose(logits["[0, -1]"][0], logits["[0, -1]"][1])


def test_the_states_do_not_depend_on_padding() -> None:
    torch.manual_seed(2)
    model = Classifier(_encoder(), 3, HeadConfig(kind="cnn", kernels=[2, 3], layers=[0, 1, -1]))
    ids = torch.tensor([[2, 7, 8, 9, 3]])
    padded = torch.tensor([[2, 7, 8, 9, 3, 0, 0, 0]])
    model.eval()
    short = model(ids, torch.ones_like(ids))
    torch.testing.assert_close(short, model(padded, (padded != 0).long()))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["finetune.layers=[]"], "at least one state"),
        (["finetune.layers=[0,0]"], "distinct"),
        (["finetune.layers=[-2]"], "indices are 0"),
        (["finetune.encoder=none", "finetune.layers=[0,-1]"], "encoder 'albert'"),
        (["finetune.long_document=segments", "finetune.layers=[0,-1]"], "truncate"),
    ],
)
def test_bad_layers_are_refused_at_load(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=rf"finetune\.layers.*{message}"):
        load_config(None, overrides)


def test_a_head_on_other_encoders_reads_the_last_state_only() -> None:
    from tibnlp.models.classifier import EmbeddingEncoder

    with pytest.raises(ValueError, match="need the transformer encoder"):
        Classifier(EmbeddingEncoder(30, 8), 3, HeadConfig(layers=[0, -1]))


@pytest.fixture
def env(tmp_path, monkeypatch):
    return pretrained_env(tmp_path, monkeypatch)


def _cfg(env, *extra: str):
    return load_config(
        None,
        [
            f"finetune.model={env.model}",
            f"finetune.output={env.tmp / 'runs'}",
            "finetune.epochs=1",
            "finetune.cnn_channels=8",
            "finetune.optimizer.lr=0.01",
            "tracking.enabled=false",
            *extra,
        ],
    )


def test_a_layer_beyond_the_models_depth_is_named(env) -> None:
    from tibnlp.training import finetune as ft_mod

    data = ft_mod.load_classification("tncc", "title")
    with pytest.raises(ConfigError, match=r"finetune\.layers.*1 layers"):
        ft_mod.prepare(_cfg(env, "finetune.layers=[0,2]"), data)


def test_the_last_state_named_twice_is_refused(env) -> None:
    from tibnlp.training import finetune as ft_mod

    data = ft_mod.load_classification("tncc", "title")
    with pytest.raises(ConfigError, match=r"finetune\.layers.*-1 and 1 are the same state"):
        ft_mod.prepare(_cfg(env, "finetune.layers=[1,-1]"), data)


def test_fine_tuning_with_layers_saves_a_model_predict_rebuilds(env) -> None:
    from tibnlp.data.collate import encode_texts
    from tibnlp.evaluation.predict import predict_proba
    from tibnlp.models.classifier_io import load_classifier
    from tibnlp.text.vocab import Vocabulary
    from tibnlp.training import finetune as ft_mod

    result = ft_mod.run_finetune(_cfg(env, "finetune.layers=[0,-1]"), "tncc")
    assert result.system.endswith("+cnn@0,-1")
    seed = result.seeds[0]
    model, meta = load_classifier(seed.directory)
    assert meta.head.layers == [0, -1]
    assert model.head.convs[0].in_channels == 2 * meta.model.hidden_size
    data = ft_mod.load_classification("tncc", "title")
    vocab = Vocabulary.load(seed.directory)
    texts = ft_mod.texts(data, "test", meta.text_form)
    probs = predict_proba(model, encode_texts(vocab, texts, meta.max_len))
    accuracy = float(np.mean(probs.argmax(1) == np.array(data.targets("test"))))
    assert accuracy == pytest.approx(seed.metrics["test"]["accuracy"])
