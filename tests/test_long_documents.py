"""`finetune.long_document`: texts longer than the window read segment by segment (with
recurrence) or with GEMFormer's global memory, on a tiny synthetic task whose texts are longer
than a 4-token window. The classifier records its reading, and `tibnlp predict` rebuilds it:
predictions after save and load equal those scored at evaluation, for every reading."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

from tests.ft_fixtures import make_data_dir, make_vocab
from tests.test_finetune import TINY_MODEL
from tibnlp.config import load_config
from tibnlp.data.collate import encode_texts
from tibnlp.data.tasks import load_tncc
from tibnlp.errors import ConfigError
from tibnlp.evaluation.predict import Predictor, predict_proba
from tibnlp.models.classifier_io import build_classifier, load_classifier, read_length
from tibnlp.models.long_documents.gemformer import select_memory, token_entropy
from tibnlp.models.long_documents.memory_reader import MemoryReader
from tibnlp.models.long_documents.windows import SegmentReader
from tibnlp.models.memory_report import load_mlm
from tibnlp.models.pretraining import AlbertForPretraining
from tibnlp.text.vocab import Vocabulary
from tibnlp.training import finetune_scores
from tibnlp.training.finetune import prepare, run_finetune

WINDOW = 4
MODEL = [*TINY_MODEL, "model.position=relative", "model.recurrence.mem_len=8"]
# a random MLM is never confident; a threshold above log(V) keeps tokens up to the budget
MEMORY = ["finetune.global_memory.threshold=100", "finetune.global_memory.budget=4"]


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
            f"finetune.output={env.tmp / 'runs' / mode}",
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


def _seed_run(env):
    client = MlflowClient(f"sqlite:///{env.tmp / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("long-docs").experiment_id])
    return next(r for r in runs if r.data.tags.get("seed") == "1")


def test_documents_are_read_past_the_window(env) -> None:
    setup = prepare(_cfg(env, "segments"), load_tncc("title"))
    assert setup.meta.max_len == WINDOW and setup.meta.reading.mode == "segments"
    assert max(len(x) for x in setup.ids["train"]) > 2 * WINDOW  # longer than two windows
    truncated = prepare(_cfg(env, "truncate"), setup.data)
    assert max(len(x) for x in truncated.ids["train"]) == WINDOW
    assert truncated.meta.reading.mode == "truncate"
    model = build_classifier(setup.meta)
    assert isinstance(model.encoder, SegmentReader) and model.encoder.segment_len == WINDOW


@pytest.mark.parametrize(
    ("mode", "extra", "system", "reader"),
    [
        ("truncate", [], "+cnn", None),
        ("segments", [], "+cnn+long-segments", SegmentReader),
        ("memory", MEMORY, "+cnn+long-memory", MemoryReader),
        (
            "memory",
            [*MEMORY, "finetune.memory_selection=frozen"],
            "+long-memory-frozen",
            MemoryReader,
        ),
    ],
    ids=["truncate", "segments", "memory", "memory-frozen"],
)
def test_predict_reads_as_evaluation_did(env, monkeypatch, mode, extra, system, reader) -> None:
    """The classifier directory alone rebuilds the reading: the saved-and-loaded classifier
    gives the test split exactly the probabilities it was scored with after training."""
    scored: list[tuple[list[list[int]], np.ndarray]] = []

    def recording(model, ids, *args, **kwargs):
        probs = predict_proba(model, ids, *args, **kwargs)
        scored.append(([list(x) for x in ids], probs))
        return probs

    monkeypatch.setattr(finetune_scores, "predict_proba", recording)
    cfg = _cfg(env, mode, *extra)
    result = run_finetune(cfg, "tncc")
    assert result.system.endswith(system)
    directory = result.seeds[0].directory
    predictor = Predictor(directory)
    assert predictor.meta.reading.mode == mode
    if reader is None:
        assert not isinstance(predictor.model.encoder, (SegmentReader, MemoryReader))
    else:
        assert isinstance(predictor.model.encoder, reader)
    data = load_tncc("title")
    ids = encode_texts(predictor.vocab, data.texts("test"), read_length(predictor.meta))
    at_evaluation = next(p for x, p in scored if x == ids)  # the test split's one scoring
    again = predict_proba(predictor.model, ids, 5, predictor.vocab.pad_id)  # other batching
    np.testing.assert_allclose(again, at_evaluation, rtol=1e-5, atol=1e-6)
    labels = [r["prediction"] for r in predictor.predict(data.texts("test"))]
    assert labels == [predictor.meta.labels[i] for i in at_evaluation.argmax(1)]
    if mode != "truncate":
        assert max(len(x) for x in ids) > WINDOW  # prediction read past the window too


def test_segments_mode_logs_its_window(env) -> None:
    run_finetune(_cfg(env, "segments"), "tncc")
    seed = _seed_run(env)
    assert seed.data.params["finetune.long_document"] == "segments"
    assert seed.data.metrics["long_document_window"] == WINDOW


def test_texts_cut_at_document_max_len_are_counted(env, capsys) -> None:
    """What a cap drops is said where the run's other notes are: per split, the texts cut at
    the read length and the tokens dropped (results notes, parent-run tags and metrics, and a
    line on stderr)."""
    cap = 8  # [CLS] + 6 pieces + [SEP]
    result = run_finetune(_cfg(env, "segments", f"finetune.document_max_len={cap}"), "tncc")
    vocab, data = Vocabulary.load(env.vocab), load_tncc("title")
    expected = {}
    for split in ("train", "validation", "test"):
        over = [n - (cap - 2) for n in map(len, map(vocab.encode, data.texts(split)))]
        expected[split] = {
            "texts": sum(d > 0 for d in over),
            "tokens": sum(d for d in over if d > 0),
        }
    assert 0 < expected["train"]["texts"] < len(data.texts("train"))  # the cap bites, not always
    cut = result.notes["cut_at_read_length"]
    assert cut["read_length"] == cap
    for split, want in expected.items():
        assert cut[split] == {"texts": want["texts"], "tokens_dropped": want["tokens"]}
    client = MlflowClient(f"sqlite:///{env.tmp / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("long-docs").experiment_id])
    parent = next(r for r in runs if "seed" not in r.data.tags)
    assert parent.data.metrics["cut_train_texts"] == expected["train"]["texts"]
    assert parent.data.metrics["cut_test_tokens_dropped"] == expected["test"]["tokens"]
    assert "cut_at_read_length" in parent.data.tags
    assert f"{expected['train']['texts']} of {len(data.texts('train'))} train texts" in (
        capsys.readouterr().err
    )


def test_memory_mode_logs_memory_size_and_share(env) -> None:
    result = run_finetune(_cfg(env, "memory", *MEMORY), "tncc")
    seed = _seed_run(env)
    for split in ("train", "validation", "test"):
        assert 3.0 < seed.data.metrics[f"{split}_memory_size_mean"] <= 4.0
        assert seed.data.metrics[f"{split}_memory_size_max"] == 4.0  # the budget binds
        assert 0.0 < seed.data.metrics[f"{split}_memory_share_mean"] < 1.0
    meta = load_classifier(result.seeds[0].directory)[1]
    assert meta.reading.memory.threshold == 100 and meta.reading.selection == "finetuned"


def _memory_reader(env, selection: str) -> tuple[MemoryReader, AlbertForPretraining]:
    setup = prepare(
        _cfg(env, "memory", *MEMORY, f"finetune.memory_selection={selection}"), load_tncc("title")
    )
    model = build_classifier(setup.meta)
    mlm, _ = load_mlm(env.model)
    model.encoder.encoder.load_state_dict(mlm.encoder.state_dict())
    model.encoder.load_mlm(mlm)
    return model.encoder, mlm


DOCS = [[2, 10, 11, 12, 13, 14, 15, 16, 3], [2, 20, 21, 3]]


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor([DOCS[0], DOCS[1] + [0] * 5])
    return ids, (ids != 0).long()


@pytest.mark.parametrize("selection", ["finetuned", "frozen"])
def test_before_fine_tuning_both_selections_are_the_pretrained_first_pass(env, selection) -> None:
    reader, mlm = _memory_reader(env, selection)
    ids, mask = _batch()
    want = select_memory(mlm, ids, mask, WINDOW, 100, 4)
    for training in (True, False):
        reader.train(training)
        got = reader.memory(DOCS, torch.device("cpu"))
        assert torch.equal(got.ids, want.ids) and torch.equal(got.size, want.size)
        assert torch.allclose(got.share, want.share)


def test_the_finetuned_selection_follows_the_weights_each_epoch(env) -> None:
    """`finetuned`: the selector is the encoder being trained; the training snapshot is kept
    within an epoch and refreshed at the next; evaluation always uses the current weights.
    `frozen`: the pretrained model's choice stays whatever the encoder learns."""
    cpu = torch.device("cpu")
    ids, mask = _batch()
    readers = {s: _memory_reader(env, s)[0] for s in ("finetuned", "frozen")}
    mlm = _memory_reader(env, "frozen")[1]
    # a threshold inside the entropies, so which tokens are kept depends on the weights
    ent = token_entropy(mlm, ids, mask, WINDOW)
    threshold = float(ent[torch.isfinite(ent)].median())
    first = {}
    for name, reader in readers.items():
        reader.threshold, reader.budget = threshold, 8
        reader.train()
        first[name] = reader.memory(DOCS, cpu).ids.clone()
        with torch.no_grad():  # "training": the encoder's weights move
            for p in reader.encoder.parameters():
                p.add_(torch.randn_like(p) * 0.5)
    tuned, frozen = readers["finetuned"], readers["frozen"]
    assert torch.equal(tuned.memory(DOCS, cpu).ids, first["finetuned"])  # the epoch's snapshot
    tuned.eval()
    now = select_memory(tuned.selector, ids, mask, WINDOW, threshold, 8).ids
    assert torch.equal(tuned.memory(DOCS, cpu).ids, now)  # evaluation: the current weights
    assert not torch.equal(now, first["finetuned"])
    tuned.train()
    tuned.refresh()
    assert torch.equal(tuned.memory(DOCS, cpu).ids, now)  # next epoch: refreshed
    frozen.refresh()
    for training in (True, False):
        frozen.train(training)
        assert torch.equal(frozen.memory(DOCS, cpu).ids, first["frozen"])
    assert all(not p.requires_grad for p in tuned.frozen_parameters())
    assert all(p.requires_grad for p in tuned.encoder.parameters())


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
    too_big = ["finetune.global_memory.budget=100", f"finetune.model={env.tmp / 'abs'}"]
    with pytest.raises(ConfigError, match=r"finetune\.global_memory\.budget"):
        run_finetune(_cfg(env, "memory", *too_big), "tncc")


@pytest.mark.parametrize(("mode", "extra"), [("segments", []), ("memory", MEMORY)])
def test_readings_run_with_the_weights_in_bf16(env, mode, extra) -> None:
    """DeepSpeed's 16-bit modes cast the whole classifier (found on an H100 in its bf16 mode,
    since replaced by autocast, where the head's conv refused the float32 states the readings
    gathered; fp16 on a GPU without bf16 still casts)."""
    setup = prepare(_cfg(env, mode, *extra), load_tncc("title"))
    model = build_classifier(setup.meta)
    if mode == "memory":
        mlm, _ = load_mlm(env.model)
        model.encoder.encoder.load_state_dict(mlm.encoder.state_dict())
        model.encoder.load_mlm(mlm)
    model.eval()  # no dropout: the two precisions read the same network
    ids = torch.tensor([[2, *range(10, 30), 3], [2, 20, 21, 3] + [0] * 18])
    with torch.no_grad():
        want, _ = model.classify(ids, (ids != 0).long())
        logits, _ = model.to(torch.bfloat16).classify(ids, (ids != 0).long())
    assert logits.dtype == torch.bfloat16
    # bf16 keeps 8 bits of mantissa: measured at most 0.003 on logits under one
    torch.testing.assert_close(logits.float(), want, rtol=0.02, atol=0.02)


@pytest.mark.parametrize(
    "options", [{"sop": False}, {"sop": False, "contrastive": 0.1}], ids=["no-sop", "contrast"]
)
def test_load_mlm_reads_models_pretrained_without_the_pair_task(env, options) -> None:
    """The main job pretrains without SOP (and a lever adds the contrast's projection): the
    MLM head loads all the same, so GEMFormer's selection and `model memory` read such models."""
    from tibnlp.models.io import save_pretrained

    cfg = load_config(None, MODEL).model
    cfg.vocab_size = Vocabulary.load(env.vocab).size
    saved = AlbertForPretraining(cfg, **options)
    folder = env.tmp / f"pretrained-{len(options)}"
    save_pretrained(saved, cfg, folder)
    for f in env.vocab.iterdir():
        shutil.copy2(f, folder / f.name)
    mlm, _ = load_mlm(folder)
    assert not mlm.sop
    for key, value in mlm.state_dict().items():
        assert torch.equal(value, saved.state_dict()[key]), key


@pytest.mark.parametrize(
    ("mode", "sets", "unread"),
    [
        ("truncate", [], []),
        ("memory", [*MEMORY, "finetune.memory_selection=frozen"], []),
        (
            "segments",
            [*MEMORY, "finetune.memory_selection=frozen", "finetune.document_max_len=64"],
            ["global_memory.threshold", "global_memory.budget", "memory_selection"],
        ),
        ("truncate", ["finetune.document_max_len=64"], ["document_max_len"]),
    ],
)
def test_long_document_settings_a_reading_never_uses(mode, sets, unread) -> None:
    """Settings for another reading are accepted (a grid over long_document shares them) but
    named: memory's settings outside memory, the document cap under truncation."""
    ft = load_config(None, [f"finetune.long_document={mode}", *sets]).finetune
    assert ft.unread_settings() == [f"finetune.{name}" for name in unread]


def test_fine_tuning_names_the_settings_it_does_not_read(env, capsys) -> None:
    result = run_finetune(_cfg(env, "truncate", *MEMORY), "tncc")
    unread = ["finetune.global_memory.threshold", "finetune.global_memory.budget"]
    assert result.notes["unread_settings"] == unread
    err = capsys.readouterr().err
    assert f"note: {', '.join(unread)} set, but long_document=truncate does not read" in err
