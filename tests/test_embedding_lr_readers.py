"""`finetune.embedding_lr` reaches the encoder's embedding layer however the classifier reads
(`learning_rates`): a long-document reader wraps the encoder, so its parameters are named
`model.encoder.encoder.embeddings.*`, not `model.encoder.embeddings.*`."""

from __future__ import annotations

import pytest

from tests.ft_fixtures import TINY_MODEL
from tibnlp.config import load_config
from tibnlp.models.classifier import Classifier, head_config
from tibnlp.models.encoder import Encoder
from tibnlp.models.long_documents.reading import Reading, build_reader
from tibnlp.training.classification import ClassifierLoss, learning_rates
from tibnlp.training.optim import param_groups


@pytest.mark.parametrize("mode", ["truncate", "segments", "memory"])
def test_embedding_lr_reaches_the_embeddings_inside_a_reader(mode: str) -> None:
    cfg = load_config(
        None,
        [
            *TINY_MODEL,
            "model.vocab_size=40",
            "finetune.embedding_lr=0.003",
            "finetune.head_lr=0.02",
            "finetune.optimizer.lr=0.001",
            "finetune.cnn_channels=8",
        ],
    )
    reader = build_reader(Encoder(cfg.model), Reading(mode=mode), 16)
    model = ClassifierLoss(Classifier(reader, 3, head_config(cfg.finetune, cfg.model)))
    groups = param_groups(model, 0.01, learning_rates(model.model, cfg.finetune))
    rate = {id(p): g.get("lr", 0.001) for g in groups for p in g["params"]}
    params = model.named_parameters()
    embeddings = {n: rate[id(p)] for n, p in params if p.requires_grad and ".embeddings." in n}
    assert embeddings and set(embeddings.values()) == {0.003}, embeddings
