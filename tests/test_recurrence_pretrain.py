"""Segment-recurrence pretraining through the real `tibnlp pretrain` path (DeepSpeed engine,
TrainLoop): chains of consecutive segments of one document, MLM only, memory without gradient."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from design_models import tiny
from mlflow.tracking import MlflowClient
from tibetan_fixtures import prepared_inputs

from tibnlp.config import load_config
from tibnlp.config.model import RecurrenceConfig
from tibnlp.data.masking import MlmCollator
from tibnlp.data.pretraining import build_pretraining_dataset, load_pretraining_dataset
from tibnlp.data.segment_chains import chain_lengths, make_chains
from tibnlp.models import AlbertForPretraining
from tibnlp.text.vocab import Vocabulary

SEQ = 16


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepared_inputs(tmp_path_factory.mktemp("rec_inputs"), n_docs=80, heldout=20)


def test_chains_cover_a_document_in_order(inputs: Path) -> None:
    vocab = Vocabulary.load(inputs / "vocab")
    sentences = [vocab.encode("བཀྲ་ཤིས་བདེ་ལེགས། ང་བོད་པ་ཡིན།") for _ in range(8)]
    flat = [t for s in sentences for t in s]
    chains = make_chains(7, sentences, vocab, SEQ, segments=3)
    assert len(chains) >= 2
    assert [t for c in chains for t in c["input_ids"][1:]] == flat  # nothing lost, in order
    for c in chains:
        assert c["input_ids"][0] == vocab.cls_id and c["length"] <= 1 + 3 * (SEQ - 1)
        assert c["sop_label"] == 0 and c["doc_id"] == 7
        assert len(c["syllable_start"]) == c["length"] == len(c["token_type_ids"])
    assert chain_lengths(1 + 2 * (SEQ - 1) + 3, SEQ) == [SEQ, SEQ, 4]


def test_recurrence_pretraining_step_trains_and_memory_has_no_gradient(inputs: Path) -> None:
    vocab = Vocabulary.load(inputs / "vocab")
    out = build_pretraining_dataset(
        inputs / "corpus", vocab, SEQ, inputs / "chains", seed=1, num_proc=1, segments=3
    )
    splits, meta = load_pretraining_dataset(out)
    assert meta["segments"] == 3 and meta["median_length"] <= SEQ
    rows = [splits["train"][i] for i in range(4)]
    assert max(r["length"] for r in rows) > SEQ  # the examples really span several segments
    batch = MlmCollator(vocab, 0.3, 2, seed=3)(rows, 0)
    cfg = tiny(position="relative", recurrence=RecurrenceConfig(mem_len=SEQ), vocab_size=vocab.size)
    torch.manual_seed(0)
    model = AlbertForPretraining(cfg, segment_len=SEQ)
    captured = []
    original = model.encoder.forward

    def spy(*args, **kw):  # type: ignore[no-untyped-def]
        if kw.get("memory") is not None:
            captured.append(kw["memory"])
        return original(*args, **kw)

    model.encoder.forward = spy  # type: ignore[method-assign]
    result = model(**batch)
    assert int(result["segments"]) >= 2 and "sop_loss" not in result
    assert captured and all(
        not s.requires_grad for mem in captured for s in mem.states
    )  # memory is gradient-stopped
    result["loss"].backward()
    assert model.encoder.embeddings.word.weight.grad is not None


def test_recurrence_pretrain_runs_through_the_engine(inputs: Path, tmp_path: Path) -> None:
    from tibnlp.training.pretrain import run_pretraining

    out = tmp_path / "run"
    data = {
        "model": {
            "embedding_size": 16,
            "hidden_size": 32,
            "num_layers": 2,
            "ffn_size": 64,
            "max_len": 64,
            "heads": {"small": 2, "large": 2},
            "position": "relative",
            "recurrence": {"mem_len": SEQ},
        },
        "pretrain": {
            "corpus": str(inputs / "corpus"),
            "vocab": str(inputs / "vocab"),
            "output": str(out),
            "seq_len": SEQ,
            "recurrence_segments": 3,
            "batch_size": 4,
            "max_steps": 6,
            "eval_every": 3,
            "eval_batches": 2,
            "log_every": 2,
            "checkpoint_every": 3,
            "optimizer": {"lr": 0.003, "warmup_steps": 1},
        },
        "engine": {"threads": 1},
        "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": "rec-pt"},
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data))
    model_dir = run_pretraining(load_config(path))
    assert (model_dir / "model.safetensors").is_file()
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("rec-pt").experiment_id])
    assert run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "train/mask_loss")
    assert len(history) >= 2 and all(torch.isfinite(torch.tensor(m.value)) for m in history)
    assert "eval/mask_accuracy" in run.data.metrics and "train/segments" in run.data.metrics
    assert "train/sop_loss" not in run.data.metrics
    assert run.data.tags["data.segments"] == "3"
