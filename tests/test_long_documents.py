"""`finetune.long_document`: texts longer than the window read segment by segment (with
recurrence) or with GEMFormer's global memory, on a tiny synthetic task whose texts are longer
than a 6-token window; memory figures reach MLflow."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest
import torch
from mlflow.tracking import MlflowClient

from tests.ft_fixtures import make_data_dir, make_vocab
from tests.test_finetune import TINY_MODEL
from tibnlp.config import load_config
from tibnlp.data.tasks import load_tncc
from tibnlp.errors import ConfigError
from tibnlp.models.classifier_io import load_classifier
from tibnlp.models.memory import GlobalMemory
from tibnlp.models.pretraining import AlbertForPretraining
from tibnlp.models.recurrence import LongDocumentEncoder
from tibnlp.text.vocab import Vocabulary
from tibnlp.training import long_documents
from tibnlp.training.finetune import prepare, run_finetune

WINDOW = 4
MODEL = [*TINY_MODEL, "model.position=relative", "model.recurrence.mem_len=8"]


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("TIBNLP_DATA", str(make_data_dir(tmp_path / "data", (30, 12, 12))))
    vocab = make_vocab(tmp_path / "vocab")
    cfg = load_config(None, MODEL).model
    cfg.vocab_size = Vocabulary.load(vocab).size
    model_dir = tmp_path / "pretrained"
    from tibnlp.models.io import save_pretrained

    torch.manual_seed(0)
    save_pretrained(AlbertForPretraining(cfg), cfg, model_dir)  # with the MLM head
    for f in vocab.iterdir():
        shutil.copy2(f, model_dir / f.name)
    return SimpleNamespace(tmp=tmp_path, vocab=vocab, model=model_dir)


def _cfg(env, mode: str, *extra: str):
    return load_config(
        None,
        [
            f"finetune.model={env.model}",
            f"finetune.output={env.tmp / 'runs'}",
            f"finetune.max_len={WINDOW}",
            f"finetune.long_document={mode}",
            "finetune.epochs=1",
            "finetune.batch_size=8",
            "finetune.cnn_channels=4",
            "finetune.cnn_kernels=[2]",
            f"tracking.uri=sqlite:///{env.tmp / 'mlflow.db'}",
            "tracking.experiment=long-docs",
            *extra,
        ],
    )


def test_documents_are_read_past_the_window(env) -> None:
    setup = prepare(_cfg(env, "segments"), load_tncc("title"))
    assert setup.meta.max_len == WINDOW
    assert max(len(x) for x in setup.ids["train"]) > 2 * WINDOW  # longer than two windows
    truncated = prepare(_cfg(env, "truncate"), setup.data)
    assert max(len(x) for x in truncated.ids["train"]) == WINDOW
    assert truncated.long is None


def test_segments_mode_trains_with_recurrence(env) -> None:
    result = run_finetune(_cfg(env, "segments"), "tncc")
    assert result.system.endswith("+cnn+long-segments")
    assert result.seeds[0].metrics["test"].count == 12
    client = MlflowClient(f"sqlite:///{env.tmp / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("long-docs").experiment_id])
    seed = next(r for r in runs if r.data.tags.get("seed") == "1")
    assert seed.data.params["finetune.long_document"] == "segments"
    assert seed.data.metrics["long_document_window"] == WINDOW
    # saved as a plain classifier (the reading wrapper is not part of the weights' keys)
    classifier, _ = load_classifier(result.seeds[0].directory)
    assert not isinstance(classifier.encoder, LongDocumentEncoder)


def test_memory_mode_logs_memory_size_and_share(env) -> None:
    # a random MLM is never confident; a threshold above log(V) keeps tokens up to the budget
    gm = ["model.global_memory.threshold=100", "model.global_memory.budget=4"]
    result = run_finetune(_cfg(env, "memory", *gm), "tncc")
    assert result.system.endswith("+long-memory")
    client = MlflowClient(f"sqlite:///{env.tmp / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("long-docs").experiment_id])
    seed = next(r for r in runs if r.data.tags.get("seed") == "1")
    for split in ("train", "validation", "test"):
        assert 3.0 < seed.data.metrics[f"{split}_memory_size_mean"] <= 4.0
        assert seed.data.metrics[f"{split}_memory_size_max"] == 4.0  # the budget binds
        assert 0.0 < seed.data.metrics[f"{split}_memory_share_mean"] < 1.0
    saved = (result.seeds[0].directory / "classifier.yaml").read_text()
    assert "threshold: 100" in saved  # the memory setting is part of the saved model config


def test_memory_cache_matches_the_first_pass(env) -> None:
    from tibnlp.models.memory import select_memory
    from tibnlp.models.memory_report import load_mlm

    mlm, _ = load_mlm(env.model)
    gm = load_config(None, ["model.global_memory.threshold=100", "model.global_memory.budget=3"])
    cache = long_documents.MemoryCache(mlm, WINDOW, gm.model.global_memory)
    docs = [[2, 10, 11, 12, 13, 14, 15, 16, 3], [2, 20, 21, 3]]
    ids = torch.tensor([docs[0], docs[1] + [0] * 5])
    mask = (ids != 0).long()
    got: GlobalMemory = cache.memory(ids, mask)
    want = select_memory(mlm, ids, mask, WINDOW, 100, 3)
    assert torch.equal(got.ids, want.ids) and torch.equal(got.size, want.size)
    assert torch.allclose(got.share, want.share)


def test_long_document_errors(env) -> None:
    with pytest.raises(ConfigError, match="pretrained model"):
        run_finetune(_cfg(env, "memory", "finetune.model=", f"finetune.vocab={env.vocab}"), "tncc")
    absolute = [m for m in MODEL if "position" not in m and "recurrence" not in m]
    cfg = load_config(None, absolute).model
    cfg.vocab_size = Vocabulary.load(env.vocab).size
    from tibnlp.models.io import save_pretrained

    save_pretrained(AlbertForPretraining(cfg), cfg, env.tmp / "abs")
    for f in env.vocab.iterdir():
        shutil.copy2(f, env.tmp / "abs" / f.name)
    too_big = ["model.global_memory.budget=100", f"finetune.model={env.tmp / 'abs'}"]
    with pytest.raises(ConfigError, match="max_len"):
        run_finetune(_cfg(env, "memory", *too_big), "tncc")


def test_segments_wrapper_is_the_recurrence_encoder(env) -> None:
    setup = prepare(_cfg(env, "segments"), load_tncc("title"))
    from tibnlp.models.classifier_io import build_classifier

    model = build_classifier(setup.meta)
    assert setup.long is not None
    setup.long.attach(model)
    assert isinstance(model.encoder, LongDocumentEncoder)
    assert model.encoder.segment_len == WINDOW
