"""benchmarks/encoder_of_classifier.py: a fine-tuned classifier's encoder becomes a model
directory that fine-tuning loads as it loads a pretrained one (the intermediate-task lever)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest
import torch

from tests.design_models import tiny
from tibnlp.models.classifier import Classifier, HeadConfig
from tibnlp.models.classifier_io import ClassifierMeta, save_classifier
from tibnlp.models.encoder import Encoder
from tibnlp.models.io import load_encoder, read_extra, save_pretrained

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "encoder_of_classifier.py"


def test_the_encoder_of_a_classifier_loads_as_a_model_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tiny(norm="pre", share_layers=False, position="relative")
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
        source_model=str(save_pretrained(Encoder(cfg), cfg, tmp_path / "pre", {"tokens": 123})),
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
    # the pretraining record of the model it started from travels too
    assert read_extra(out) == {"tokens": 123, "intermediate_dataset": "toy"}
