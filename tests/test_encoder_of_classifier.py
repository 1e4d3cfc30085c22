"""benchmarks/encoder_of_classifier.py: a fine-tuned classifier's encoder becomes a model
directory that fine-tuning loads as it loads a pretrained one (the intermediate-task lever)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest
import torch

from tibnlp.config.model import HeadsConfig, ModelConfig
from tibnlp.models.classifier import Classifier, HeadConfig
from tibnlp.models.classifier_io import ClassifierMeta, save_classifier
from tibnlp.models.encoder import Encoder
from tibnlp.models.io import load_encoder

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "encoder_of_classifier.py"


def test_the_encoder_of_a_classifier_loads_as_a_model_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = ModelConfig(
        vocab_size=40,
        embedding_size=8,
        hidden_size=8,
        num_layers=2,
        ffn_size=16,
        max_len=16,
        norm="pre",
        share_layers=False,
        position="relative",
        heads=HeadsConfig(small=2, large=2),
    )
    torch.manual_seed(0)
    head = HeadConfig(kind="cnn", kernels=[2], channels=4, layers=[0, -1])
    model = Classifier(Encoder(cfg), 3, head)
    vocab = tmp_path / "vocab"
    vocab.mkdir()
    (vocab / "spm.model").write_bytes(b"pieces")
    meta = ClassifierMeta(
        encoder="albert",
        labels=["a", "b", "c"],
        max_len=16,
        vocab_sha256="0" * 64,
        vocab_size=40,
        head=head,
        model=cfg,
        dataset="toy",
    )
    classifier = save_classifier(tmp_path / "seed-1", model, meta, vocab)
    out = tmp_path / "encoder"
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), str(classifier), str(out)])
    runpy.run_path(str(SCRIPT), run_name="__main__")

    loaded_cfg, encoder = load_encoder(out)
    assert loaded_cfg == cfg
    want = model.encoder.state_dict()
    got = encoder.state_dict()
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert (out / "spm.model").read_bytes() == b"pieces"  # the vocabulary travels with it
