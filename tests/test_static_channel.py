"""The static word-vector channel (`finetune.static_vectors`): frozen vectors read by the CNN
head beside the encoder's states, saved with the classifier, random for the twin."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.ft_fixtures import make_data_dir, make_model_dir, make_vocab
from tibnlp.config import load_config
from tibnlp.errors import ConfigError, DataError
from tibnlp.evaluation.predict import predict_proba
from tibnlp.models.classifier_io import load_classifier
from tibnlp.models.io import load_config_file
from tibnlp.training.finetune import run_finetune
from tibnlp.training.finetune_setup import load_static_vectors


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("TIBNLP_DATA", str(make_data_dir(tmp_path / "data")))
    vocab = make_vocab(tmp_path / "vocab")
    # a pretraining output as the pipeline sees it: OUTPUT/model (the model directory) beside
    # OUTPUT/skipgram/vectors.pt (the skip-gram start the run kept)
    output = tmp_path / "pretrain"
    model = make_model_dir(output, vocab).rename(output / "model")
    size = load_config_file(model).vocab_size
    vectors = torch.randn(size, 6, generator=torch.Generator().manual_seed(0))
    (output / "skipgram").mkdir()
    torch.save(vectors, output / "skipgram" / "vectors.pt")
    return SimpleNamespace(tmp=tmp_path, model=model, vectors=vectors, size=size)


def _cfg(env, *extra: str):
    return load_config(
        None,
        [
            f"finetune.model={env.model}",
            f"finetune.output={env.tmp / 'runs'}",
            f"finetune.static_vectors={env.model}",
            "finetune.epochs=2",
            "finetune.batch_size=16",
            "finetune.cnn_channels=8",
            "finetune.optimizer.lr=0.01",
            "finetune.layers=[0,-1]",
            "tracking.enabled=false",
            *extra,
        ],
    )


def test_the_channel_stays_frozen_and_predict_reads_it(env) -> None:
    result = run_finetune(_cfg(env, "finetune.probe_epochs=1"), "tncc")
    assert result.system == "albert-pretrained(model)+cnn@0,-1+static+probe1"
    seed_dir = result.seeds[0].directory
    saved = load_file(str(seed_dir / "model.safetensors"))
    assert torch.equal(saved["static_vectors"], env.vectors)  # never trained
    original = load_file(str(env.model / "model.safetensors"))
    word = "embeddings.word.weight"
    assert not torch.equal(saved[f"encoder.{word}"], original[word])  # the encoder was
    model, meta = load_classifier(seed_dir)
    assert meta.head.static_size == 6 and model.static_vectors is not None
    assert "static_vectors" not in dict(model.named_parameters())
    # the channel feeds the head: other vectors, other logits
    ids = [[2, 7, 8, 9, 3], [2, 10, 3]]
    before = predict_proba(model, ids, batch_size=2)
    model.static_vectors.mul_(-1.0)
    assert not np.allclose(before, predict_proba(model, ids, batch_size=2))


def test_the_twin_reads_a_frozen_random_table_of_the_same_shape(env) -> None:
    result = run_finetune(_cfg(env, "finetune.init=random", "finetune.epochs=1"), "tncc")
    assert result.system == "albert-random(model)+cnn@0,-1+static"
    table = load_file(str(result.seeds[0].directory / "model.safetensors"))["static_vectors"]
    assert table.shape == env.vectors.shape and not torch.equal(table, env.vectors)
    assert 0.8 < float(table.std()) < 1.2  # N(0, 1), drawn per seed


def test_vectors_are_found_beside_a_model_directory_or_named_as_a_file(env) -> None:
    by_dir = load_static_vectors(env.model, env.size)
    by_output = load_static_vectors(env.model.parent, env.size)
    by_file = load_static_vectors(env.model.parent / "skipgram" / "vectors.pt", env.size)
    assert torch.equal(by_dir, env.vectors) and torch.equal(by_output, by_file)
    with pytest.raises(DataError, match=r"holds no skip-gram vectors"):
        load_static_vectors(env.tmp / "vocab", env.size)
    with pytest.raises(DataError, match=r"rows, the model's vocabulary"):
        load_static_vectors(env.model, env.size + 1)
    bad = env.tmp / "bad.pt"
    bad.write_text("not a tensor")
    with pytest.raises(DataError, match=r"bad.pt is not a tensor file"):
        load_static_vectors(bad, env.size)


def test_the_channel_needs_the_cnn_head_on_a_transformer() -> None:
    for extra in ("finetune.encoder=none", "finetune.head=linear"):
        with pytest.raises(ConfigError, match=r"finetune.static_vectors"):
            load_config(None, ["finetune.static_vectors=v.pt", extra])
