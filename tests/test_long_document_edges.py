"""Long documents: the refresh on the training thread, no text-less segment, the memory budget."""

from __future__ import annotations

import functools
import threading

import torch

from tests.test_long_documents import MEMORY, _cfg, env  # noqa: F401
from tibnlp.training import finetune, loop
from tibnlp.training.finetune import run_finetune


def test_gemformer_refresh_runs_on_the_training_thread_at_each_real_epoch_start(
    env,  # noqa: F811
    monkeypatch,
) -> None:
    """On a GPU the loop prefetches the next batch in a background thread (LoopSettings.prefetch
    None -> on for CUDA). Building epoch e's plan runs `on_epoch(e)`, GEMFormer's memory
    refresh: it must run on the training thread once epoch e-1 is trained and evaluated, not
    on the prefetch thread during the last step (racing the update and the encoder's
    train/eval flag), and not for an epoch after the last one."""
    monkeypatch.setattr(loop, "LoopSettings", functools.partial(loop.LoopSettings, prefetch=True))
    calls: list[tuple[int, bool]] = []
    real = finetune.prepare_reader

    def spy(reader, ft, ids):
        stats, hook = real(reader, ft, ids)

        def recorded(epoch: int) -> None:
            calls.append((epoch, threading.current_thread() is threading.main_thread()))
            hook(epoch)

        return stats, recorded

    monkeypatch.setattr(finetune, "prepare_reader", spy)
    torch.set_num_threads(1)
    run_finetune(_cfg(env, "memory", *MEMORY, "finetune.epochs=2", "finetune.patience=5"), "tncc")
    assert calls == [(0, True), (1, True)]


def test_a_document_ending_at_a_segment_boundary_is_not_classified_from_its_lone_sep() -> None:
    """`[CLS] t1..t4 [SEP]` with 4 content positions per segment: the [SEP] alone spills into a
    second segment `[CLS] [SEP]`. The linear head reads position 0 (the last segment's [CLS]),
    so without recurrence every such document got the same vector whatever its text."""
    from design_models import tiny

    from tibnlp.models.encoder import Encoder
    from tibnlp.models.long_documents.windows import encode_long
    from tibnlp.text.special import CLS_ID, SEP_ID

    torch.manual_seed(0)
    enc = Encoder(tiny()).eval()
    a = torch.tensor([[CLS_ID, 10, 11, 12, 13, SEP_ID]])
    b = torch.tensor([[CLS_ID, 20, 21, 22, 23, SEP_ID]])
    mask = torch.ones_like(a)
    with torch.no_grad():
        va = encode_long(enc, a, mask, segment_len=5).hidden[:, 0]
        vb = encode_long(enc, b, mask, segment_len=5).hidden[:, 0]
    assert not torch.allclose(va, vb)  # the documents' texts differ


def test_memory_budget_over_max_len_is_a_config_error_for_relative_positions_too() -> None:
    """The encoder refuses rows longer than model.max_len whatever its positions, so
    `[CLS] memory [SEP] window` over max_len must fail at config time for a relative model
    too, not at the first training step after the first pass over every split."""
    import pytest

    from tibnlp.config import load_config
    from tibnlp.errors import ConfigError
    from tibnlp.models.encoder import Encoder
    from tibnlp.models.long_documents.memory_reader import MemoryReader
    from tibnlp.training.long_documents import reading_of

    cfg = load_config(
        None,
        [
            "model.position=relative",
            "model.max_len=16",
            "model.hidden_size=16",
            "model.embedding_size=8",
            "model.ffn_size=16",
            "model.num_layers=1",
            "model.heads.small=2",
            "model.heads.large=2",
            "model.vocab_size=40",
            "finetune.model=some/pretrained",
            "finetune.long_document=memory",
            "finetune.global_memory.budget=8",
        ],
    )
    reader = MemoryReader(Encoder(cfg.model).eval(), 16, threshold=100.0, budget=8)
    doc = torch.tensor([[2, *range(10, 40), 3]])
    with pytest.raises(ValueError, match="max_len"):  # what the run would hit at step 1
        reader(doc, torch.ones_like(doc))
    with pytest.raises(ConfigError, match="budget"):
        reading_of(cfg.finetune, cfg.model, 16)


def test_a_training_starting_over_selects_its_memory_with_the_weights_it_starts_from(
    env,  # noqa: F811
) -> None:
    """A soup's next copy starts again from the seed's weights (`fine_tune_copies`), but its
    first epoch read the GEMFormer memory that the last copy's trained encoder had chosen at
    its last refresh (epoch 0 never refreshed): the copy then depended on the one before, and
    a resumed soup (earlier copies loaded, not trained) trained it on another memory."""
    import copy

    from tibnlp.data.tasks import load_tncc
    from tibnlp.models.classifier_io import build_classifier
    from tibnlp.models.long_documents.gemformer import token_entropy
    from tibnlp.models.memory_report import load_mlm
    from tibnlp.training.finetune import prepare
    from tibnlp.training.long_documents import prepare_reader

    cfg = _cfg(env, "memory", *MEMORY, "finetune.soup=2", "finetune.epochs=2")
    setup = prepare(cfg, load_tncc("title"))
    model = build_classifier(setup.meta)
    mlm, _ = load_mlm(env.model)
    model.encoder.encoder.load_state_dict(mlm.encoder.state_dict())
    reader = model.encoder
    # a threshold inside the entropies, so which tokens are kept depends on the weights
    ids = torch.tensor([setup.ids["train"][0]])
    ent = token_entropy(mlm, ids, torch.ones_like(ids), reader.segment_len)
    reader.threshold, reader.budget = float(ent[torch.isfinite(ent)].median()), 8
    _, on_epoch = prepare_reader(reader, cfg.finetune, setup.ids)
    assert on_epoch is not None
    start = copy.deepcopy(model.state_dict())  # as `fine_tune_copies` takes it

    def kept() -> dict:
        return {tuple(d): reader.kept[tuple(d)].ids for d in setup.ids["train"]}

    chosen = kept()
    on_epoch(0)  # copy 0's first epoch reads the snapshot just taken
    assert kept() == chosen
    with torch.no_grad():  # copy 0 trains: the encoder's weights move
        for p in reader.encoder.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    on_epoch(1)
    assert kept() != chosen  # the next epoch reads the moved weights' choice
    model.load_state_dict(start)  # copy 1 starts over from the seed's weights
    on_epoch(0)
    assert kept() == chosen
