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
