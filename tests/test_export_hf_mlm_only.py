"""The Hugging Face export of models pretrained without SOP (`pretrain.sop: false`, with or
without the same-document contrast): stock ALBERT computes their encoder and MLM head."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tibnlp.config.model import HeadsConfig, ModelConfig
from tibnlp.export.hf_model import albert_config, albert_state
from tibnlp.models.pretraining import AlbertForPretraining

transformers = pytest.importorskip("transformers", reason="needs the hf extra: tibnlp[hf]")


@pytest.mark.parametrize("contrastive", [0.0, 0.1])
def test_mlm_only_pretraining_exports_to_the_same_states_and_logits(contrastive: float) -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=60, embedding_size=16, hidden_size=32, num_layers=2, ffn_size=64,
        max_len=32, heads=HeadsConfig(small=4, large=4),
    )  # fmt: skip
    model = AlbertForPretraining(cfg, sop=False, contrastive=contrastive).eval()
    tensors = albert_state(cfg, model.state_dict(), Path("model.safetensors"))
    vocab = SimpleNamespace(pad_id=0, cls_id=2, sep_id=3)
    conf = {k: v for k, v in albert_config(cfg, vocab).items() if k != "dtype"}  # type: ignore[arg-type]
    hf = transformers.AlbertForMaskedLM(transformers.AlbertConfig(**conf)).eval()
    missing, unexpected = hf.load_state_dict(tensors, strict=False)
    assert not unexpected and set(missing) <= {"predictions.decoder.weight"}  # tied
    ids = torch.randint(5, 60, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    real = mask.bool()
    with torch.no_grad():
        ours = model.encoder(ids, mask).hidden
        theirs = hf(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    torch.testing.assert_close(ours[real], theirs.hidden_states[-1][real], atol=1e-5, rtol=0)
    torch.testing.assert_close(model.mlm_logits(ours)[real], theirs.logits[real], atol=1e-5, rtol=0)
