"""Memory tokens and uncertainty-guided global memory (MODELS.md section 6)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import sentencepiece as spm
import torch
from design_models import tiny

from tibnlp.config.model import ScalesConfig
from tibnlp.errors import ConfigError, DataError
from tibnlp.models import AlbertForPretraining, Encoder, save_pretrained
from tibnlp.models.long_documents.gemformer import (
    encode_with_memory,
    keep_low_entropy,
    select_memory,
    token_entropy,
)
from tibnlp.models.long_documents.memory_reader import MemoryReader
from tibnlp.models.memory_report import inspect_memory

LINES = [
    "བོད་ཀྱི་སྐད་ཡིག་ནི་རིག་གནས་ཀྱི་གཞི་རྩ་ཡིན།",
    "ལྷ་སའི་གནམ་གཤིས་ནི་དྭངས་ཤིང་ཉི་འོད་ཆེ།",
    "སློབ་མ་ཚོས་དཔེ་ཆ་ཀློག་གི་ཡོད།",
    "རི་བོ་མཐོན་པོ་དང་མཚོ་སྔོན་པོ་མང་།",
    "ཞིང་པ་ཚོས་ནས་དང་གྲོ་འདེབས་ཀྱི་ཡོད།",
]


def test_memory_tokens_are_prepended_attended_and_dropped() -> None:
    torch.manual_seed(0)
    enc = Encoder(tiny(memory_tokens=3)).eval()
    assert enc.memory_tokens is not None and enc.memory_tokens.states.shape == (3, 32)
    ids = torch.randint(5, 40, (2, 6))
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    out = enc(ids, mask)
    assert out.hidden.shape == (2, 6, 32) and out.hidden[1, 4:].abs().max() == 0
    alone = enc(ids[1:, :4], mask[1:, :4]).hidden
    torch.testing.assert_close(out.hidden[1, :4], alone[0], atol=1e-5, rtol=1e-5)
    # Every token attends to the memory: changing a memory slot changes every output.
    with torch.no_grad():
        enc.memory_tokens.states[1] += 1.0
    moved = enc(ids, mask).hidden
    assert all(not torch.allclose(moved[0, j], out.hidden[0, j]) for j in range(6))
    # The memory receives gradients (it is attended to by the real tokens). A random
    # projection, not .sum(): a LayerNorm output sums to a constant, so the gradient of its
    # sum is zero up to rounding (it passed or failed by the CPU's rounding).
    hidden = enc(ids, mask).hidden
    (hidden * torch.randn(hidden.shape)).sum().backward()
    assert enc.memory_tokens.states.grad is not None
    assert enc.memory_tokens.states.grad.abs().min() > 0


def test_memory_tokens_compose_with_relative_positions_and_recurrence() -> None:
    from tibnlp.config.model import RecurrenceConfig

    cfg = tiny(memory_tokens=2, position="relative", recurrence=RecurrenceConfig(mem_len=4))
    enc = Encoder(cfg).eval()
    ids = torch.randint(5, 40, (1, 5))
    out = enc(ids, torch.ones_like(ids))
    assert out.memory is not None and out.memory.states[0].shape == (1, 4, 32)  # no [MEM]
    out2 = enc(ids, torch.ones_like(ids), memory=out.memory)
    assert out2.hidden.shape == (1, 5, 32) and torch.isfinite(out2.hidden).all()
    with pytest.raises(ConfigError, match="memory_tokens"):
        tiny(memory_tokens=2, scales=ScalesConfig(windows=["3"])).validate("model")


def test_keep_low_entropy_order_threshold_budget_and_specials() -> None:
    ids = torch.tensor([[2, 10, 11, 12, 13, 14, 3], [2, 20, 21, 0, 0, 0, 0]])
    inf = float("inf")
    ent = torch.tensor([[inf, 0.1, 0.5, 0.29, 0.3, 0.0, 0.01], [inf, 0.2, 0.9, inf, inf, inf, inf]])
    mem = keep_low_entropy(ids, ent, threshold=0.3, budget=2)
    assert mem.positions.tolist() == [[1, 3], [1, -1]]  # document order, first two, < 0.3
    assert mem.ids.tolist() == [[10, 12], [20, 0]]
    assert mem.size.tolist() == [2, 1]
    torch.testing.assert_close(mem.share, torch.tensor([2 / 5, 1 / 2]))  # [SEP] is not content
    stats = mem.stats()
    assert stats["memory_size_mean"] == 1.5 and stats["memory_share_mean"] == pytest.approx(0.45)
    wide = keep_low_entropy(ids, ent, threshold=0.3, budget=10)
    assert wide.positions[0].tolist() == [1, 3, 5]  # the [SEP] at 6 is never memory


def test_token_entropy_is_the_mlm_distribution_entropy() -> None:
    torch.manual_seed(0)
    model = AlbertForPretraining(tiny()).eval()
    ids = torch.randint(5, 40, (2, 8))
    ids[:, 0] = 2
    mask = torch.tensor([[1] * 8, [1] * 5 + [0] * 3])
    ent = token_entropy(model, ids, mask, segment_len=16)  # one segment: the plain encoder
    with torch.no_grad():
        p = torch.softmax(model.mlm_logits(model.encoder(ids, mask).hidden), -1)
    ref = -(p * p.log()).sum(-1)
    torch.testing.assert_close(ent[0, 1:], ref[0, 1:])
    torch.testing.assert_close(ent[1, 1:5], ref[1, 1:5])
    assert torch.isinf(ent[:, 0]).all() and torch.isinf(ent[1, 5:]).all()
    split = token_entropy(model, ids, mask, segment_len=4)  # several segments
    assert torch.isfinite(split[0, 1:]).all() and split.shape == ids.shape


def test_select_memory_keeps_confident_tokens_and_classifies() -> None:
    torch.manual_seed(0)
    model = AlbertForPretraining(tiny()).eval()
    ids = torch.randint(5, 40, (2, 12))
    ids[:, 0] = 2
    mask = torch.tensor([[1] * 12, [1] * 7 + [0] * 5])
    assert select_memory(model, ids, mask, 6).size.tolist() == [0, 0]  # near-uniform at init
    with torch.no_grad():
        model.mlm_bias[7] = 1e3  # every position predicts token 7 with certainty
    mem = select_memory(model, ids, mask, 6, threshold=0.3, budget=4)
    assert mem.size.tolist() == [4, 4]
    assert mem.positions.tolist() == [[1, 2, 3, 4], [1, 2, 3, 4]]
    enc = model.encoder
    vec = encode_with_memory(enc, ids, mask, mem, 6, prefixes=[[11, 12], [13]]).sentence
    assert vec.shape == (2, enc.sentence_dim) and torch.isfinite(vec).all()
    # Pooling is over the document's own segments: row 1 alone gives the same vector.
    sub = keep_low_entropy(ids[1:, :7], torch.zeros(1, 7), 0.3, 4)
    alone = encode_with_memory(enc, ids[1:, :7], mask[1:, :7], sub, 6, prefixes=[[13]])
    torch.testing.assert_close(vec[1], alone.sentence[0], atol=1e-5, rtol=1e-5)
    # The encoder module: document states for any head, stats to log, the MLM not trained.
    gm = MemoryReader(enc, segment_len=6, threshold=0.3, budget=4, selection="frozen")
    gm.load_mlm(model)
    out = gm(ids, mask)
    assert out.hidden.shape == (2, 12, 32) and out.hidden[1, 7:].abs().max() == 0
    torch.testing.assert_close(out.sentence, encode_with_memory(enc, ids, mask, mem, 6).sentence)
    assert gm.last_stats["memory_size_mean"] == 4.0
    trained = [p for p in gm.parameters() if p.requires_grad]
    assert len(trained) == sum(1 for _ in enc.parameters())  # the selector is frozen
    with pytest.raises(ValueError, match="max_len"):
        encode_with_memory(enc, ids, mask, mem, 6, prefixes=[[5] * 25, [5]])


def _model_dir(tmp_path: Path) -> tuple[Path, Path]:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(LINES * 4),
        model_prefix=str(tmp_path / "spm"),
        vocab_size=60,
        model_type="unigram",
        pad_id=0,
        unk_id=1,
        bos_id=-1,
        eos_id=-1,
        pad_piece="[PAD]",
        unk_piece="[UNK]",
        control_symbols=["[CLS]", "[SEP]", "[MASK]"],
        character_coverage=1.0,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    size = spm.SentencePieceProcessor(model_file=str(tmp_path / "spm.model")).get_piece_size()
    cfg = tiny(vocab_size=size)
    torch.manual_seed(0)
    model = AlbertForPretraining(cfg)
    with torch.no_grad():
        model.mlm_bias[9] = 1e3
    out = tmp_path / "model"
    save_pretrained(model, cfg, out)
    (out / "spm.model").write_bytes((tmp_path / "spm.model").read_bytes())
    text = tmp_path / "doc.txt"
    text.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return out, text


def test_inspect_memory_and_cli(tmp_path: Path) -> None:
    model_dir, text = _model_dir(tmp_path)
    report = inspect_memory(model_dir, text, budget=5, segment_len=16)
    assert len(report.kept) == 5 and report.tokens > 20
    assert [k.position for k in report.kept] == [1, 2, 3, 4, 5]
    assert all(k.entropy < 0.3 for k in report.kept)
    assert report.share == pytest.approx(5 / report.tokens)
    assert report.memory_text
    cmd = [sys.executable, "-m", "tibnlp.cli.main", "model", "memory"]
    cmd += ["--model", str(model_dir), "--text", str(text), "--budget", "3"]
    cmd += ["--segment-len", "16"]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    assert f"memory 3 of {report.tokens} tokens" in res.stdout
    assert report.kept[0].piece in res.stdout
    bad = subprocess.run(
        [*cmd[:5], "--model", str(tmp_path), "--text", str(text)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode != 0 and "model.yaml" in bad.stdout + bad.stderr
    assert "Traceback" not in bad.stderr


def test_inspect_memory_errors(tmp_path: Path) -> None:
    model_dir, text = _model_dir(tmp_path)
    with pytest.raises(DataError, match="does not exist"):
        inspect_memory(model_dir, tmp_path / "missing.txt")
    (model_dir / "spm.model").unlink()
    with pytest.raises(DataError, match=r"spm\.model"):
        inspect_memory(model_dir, text)
