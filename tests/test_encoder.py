"""ALBERT-tiny encoder, pretraining heads and model directories."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tibnlp.config.model import HeadsConfig, ModelConfig
from tibnlp.errors import ConfigError, DataError
from tibnlp.models import (
    AlbertForPretraining,
    Encoder,
    build_encoder,
    load_encoder,
    load_pretrained,
    read_extra,
    save_pretrained,
)
from tibnlp.models.attention import AttentionContext


def tiny(**kw: object) -> ModelConfig:
    base: dict[str, object] = dict(
        vocab_size=50, embedding_size=8, hidden_size=24, num_layers=2, ffn_size=32, max_len=64
    )
    base.update(kw)
    return ModelConfig(**base)  # type: ignore[arg-type]


def batch(lengths: list[int], n: int, vocab: int = 50, seed: int = 0):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (len(lengths), n), generator=g)
    mask = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]
    ids = ids.masked_fill(~mask, 0)
    return ids, mask.long()


def test_shapes_and_shared_weights() -> None:
    cfg = tiny()
    enc = Encoder(cfg).eval()
    ids, mask = batch([10, 7], 12)
    out = enc(ids, mask)
    assert out.hidden.shape == (2, 12, 24)
    assert out.route_large_fraction.item() == 0.0
    # One layer's weights, whatever num_layers says: ALBERT's cross-layer sharing.
    deeper = Encoder(tiny(num_layers=6))
    assert sum(p.numel() for p in deeper.parameters()) == sum(p.numel() for p in enc.parameters())
    # The padding rows of the output are zero.
    assert out.hidden[1, 7:].abs().max().item() == 0.0


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_unshared_layers_run_the_same_loop_with_their_own_weights(norm: str) -> None:
    """share_layers=false: num_layers x the layer parameters at the same analytic FLOPs; with
    every later layer a copy of the first it computes exactly what the shared model does."""
    from tibnlp.models.summary import training_flops_per_token

    shared_cfg, own_cfg = tiny(num_layers=3, norm=norm), tiny(num_layers=3, norm=norm)
    own_cfg.share_layers = False
    shared, own = Encoder(shared_cfg).eval(), Encoder(own_cfg).eval()
    layer = sum(p.numel() for p in shared.layer.parameters())
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(own) - count(shared) == 2 * layer
    flops = [training_flops_per_token(c, 64, 0.15) for c in (shared_cfg, own_cfg)]
    assert flops[0] == flops[1]
    assert own.layer_at(2) is not own.layer_at(1) and shared.layer_at(2) is shared.layer
    ids, mask = batch([10, 6], 12)
    own.load_state_dict(shared.state_dict(), strict=False)  # embeddings, layer 1, final norm
    assert not torch.allclose(own(ids, mask).hidden, shared(ids, mask).hidden)
    for later in own.later_layers:
        later.load_state_dict(shared.layer.state_dict())
    torch.testing.assert_close(own(ids, mask).hidden, shared(ids, mask).hidden)


def test_unshared_layers_save_and_load(tmp_path: Path) -> None:
    cfg = tiny(num_layers=3, share_layers=False)
    model = AlbertForPretraining(cfg).eval()
    save_pretrained(model, cfg, tmp_path / "m")
    cfg2, enc = load_encoder(tmp_path / "m")
    assert cfg2.share_layers is False and len(enc.later_layers) == 2
    ids, mask = batch([7, 3], 7)
    torch.testing.assert_close(enc.eval()(ids, mask).hidden, model.encoder(ids, mask).hidden)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_padding_invariance(norm: str) -> None:
    enc = Encoder(tiny(norm=norm)).eval()
    ids, mask = batch([9, 5], 9)
    together = enc(ids, mask).hidden
    alone = enc(ids[1:, :5], mask[1:, :5]).hidden
    padded_more = enc(F.pad(ids, (0, 7)), F.pad(mask, (0, 7))).hidden
    torch.testing.assert_close(together[1, :5], alone[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(padded_more[:, :9], together, rtol=1e-5, atol=1e-5)


def test_left_padding_is_rejected() -> None:
    enc = Encoder(tiny())
    ids, mask = batch([4], 6)
    with pytest.raises(ValueError, match="prefix"):
        enc(ids, mask.flip(1))


def test_sentence_vector_is_the_cls_state() -> None:
    enc = Encoder(tiny()).eval()
    ids, mask = batch([6, 3], 6)
    out = enc(ids, mask)
    vec = enc.sentence_vector(out, mask)
    assert vec.shape == (2, enc.sentence_dim) == (2, 24)
    torch.testing.assert_close(vec, out.hidden[:, 0])


def test_model_pooling_moved_to_finetune() -> None:
    """The old key names where it went; a saved model.yaml that holds it still loads."""
    from tibnlp.config import load_config
    from tibnlp.config.core import from_dict, to_dict
    from tibnlp.config.model import ModelConfig, drop_moved_keys
    from tibnlp.errors import ConfigError

    with pytest.raises(ConfigError, match=r"model.pooling' has moved to 'finetune.pooling'"):
        load_config(overrides=["model.pooling=cls_max"])
    saved = {**to_dict(tiny()), "pooling": "cls_max"}
    assert from_dict(ModelConfig, drop_moved_keys(saved), "model") == tiny()


def test_pretraining_metrics_and_sparse_mlm_equals_dense() -> None:
    cfg = tiny()
    model = AlbertForPretraining(cfg).eval()
    ids, mask = batch([8, 6], 8)
    labels = torch.full_like(ids, -100)
    labels[0, 2], labels[0, 5], labels[1, 1] = 7, 9, 3
    sop = torch.tensor([0, 1])
    out = model(ids, mask, None, labels, sop)
    assert set(out) == {
        "loss",
        "mask_loss",
        "mask_accuracy",
        "sop_loss",
        "sop_accuracy",
        "route_large_fraction",
    }
    torch.testing.assert_close(out["loss"], out["mask_loss"] + out["sop_loss"])
    # Reference: the vocabulary projection at every position, then the loss at masked ones.
    h = model.encoder(ids, mask).hidden
    z = model.mlm_norm(F.gelu(model.mlm_dense(h)))
    logits = z @ model.encoder.embeddings.word.weight.T + model.mlm_bias
    ref = F.cross_entropy(logits.view(-1, cfg.vocab_size), labels.view(-1), ignore_index=-100)
    torch.testing.assert_close(out["mask_loss"], ref)


def test_no_masked_token_gives_zero_mask_loss_and_gradients_flow() -> None:
    model = AlbertForPretraining(tiny())
    ids, mask = batch([5], 5)
    out = model(ids, mask, None, torch.full_like(ids, -100), torch.tensor([1]))
    assert out["mask_loss"].item() == 0.0
    out["loss"].backward()
    assert model.sop_classifier.weight.grad is not None


def test_pre_norm_layer_is_x_plus_f_of_norm_x() -> None:
    """pre-LN, one layer: out = final(x1 + ffn(norm2(x1))), x1 = x0 + attn(norm1(x0))."""
    torch.manual_seed(0)
    enc = Encoder(tiny(norm="pre", num_layers=1)).eval()
    ids, mask = batch([6, 6], 6)
    with torch.no_grad():
        got = enc(ids, mask).hidden
        layer = enc.layer
        x0 = enc.embeddings(ids, torch.zeros_like(ids))
        ctx = AttentionContext(mask.bool(), mask.sum(1), 0, 1).at_layer(0)
        x1 = x0 + layer.attention(layer.attention_norm(x0), ctx, torch.zeros(2, dtype=torch.bool))
        x2 = x1 + layer.ffn_out(F.gelu(layer.ffn_in(layer.ffn_norm(x1))))
        want = enc.final_norm(x2)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert Encoder(tiny()).final_norm is None


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_tiny_model_overfits_one_batch(norm: str) -> None:
    torch.manual_seed(0)
    model = AlbertForPretraining(tiny(dropout=0.0, attention_dropout=0.0, norm=norm))
    ids, mask = batch([8, 8, 6, 7], 8)
    labels = torch.full_like(ids, -100)
    labels[:, 2] = ids[:, 2]
    labels[:, 4] = ids[:, 4]
    ids = ids.clone()
    ids[:, 2] = ids[:, 4] = 1  # the [MASK] id of this toy vocabulary
    sop = torch.tensor([0, 1, 0, 1])
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    for _ in range(200):
        opt.zero_grad()
        out = model(ids, mask, None, labels, sop)
        out["loss"].backward()
        opt.step()
    assert out["loss"].item() < 0.2  # from ~4.6 (ln 50 + ln 2) at initialisation


def test_save_load_roundtrip(tmp_path: Path) -> None:
    cfg = tiny(heads=HeadsConfig(small=4, large=6, threshold=5, rule="sentence"))
    model = AlbertForPretraining(cfg).eval()
    save_pretrained(model, cfg, tmp_path / "m", extra={"step": 12})
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["model.safetensors", "model.yaml"]
    cfg2, state = load_pretrained(tmp_path / "m")
    assert cfg2 == cfg
    assert read_extra(tmp_path / "m") == {"step": 12}
    fresh = AlbertForPretraining(cfg2).eval()
    fresh.load_state_dict(state)
    ids, mask = batch([7, 3], 7)
    torch.testing.assert_close(fresh.encoder(ids, mask).hidden, model.encoder(ids, mask).hidden)
    _, enc = load_encoder(tmp_path / "m")
    torch.testing.assert_close(enc.eval()(ids, mask).hidden, model.encoder(ids, mask).hidden)


def test_load_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"model\.yaml"):
        load_pretrained(tmp_path)
    cfg = tiny()
    save_pretrained(Encoder(cfg), cfg, tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x00garbage")
    with pytest.raises(DataError, match=r"model\.safetensors"):
        load_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(DataError, match=r"model\.safetensors"):
        load_pretrained(tmp_path)
    (tmp_path / "model.yaml").write_text("hidden_size: -3\n")
    with pytest.raises(ConfigError, match=r"model\.yaml"):
        load_pretrained(tmp_path)


def test_a_pretraining_run_folder_points_at_its_model(tmp_path: Path) -> None:
    """The hint named `--model`, an option `pretrain` (init_from) does not have; a run's
    folder holding OUTPUT/model is now pointed at that folder."""
    with pytest.raises(DataError) as err:
        load_pretrained(tmp_path)
    assert "not a saved model directory" in err.value.message
    assert "--model" not in str(err.value.hint)
    cfg = tiny()
    save_pretrained(Encoder(cfg), cfg, tmp_path / "model")
    with pytest.raises(DataError) as err:
        load_pretrained(tmp_path)
    assert f"use {tmp_path / 'model'}," in str(err.value.hint)


def test_auto_threshold_must_be_resolved(tmp_path: Path) -> None:
    dyn = tiny(heads=HeadsConfig(small=4, large=6, threshold="auto"))
    with pytest.raises(ConfigError, match="threshold"):
        build_encoder(dyn)
    fixed = tiny(heads=HeadsConfig(small=6, large=6, threshold="auto"))
    save_pretrained(build_encoder(fixed), fixed, tmp_path)  # unused by a fixed-head model
    assert load_pretrained(tmp_path)[0] == fixed


def test_sinusoidal_position_init_relates_every_offset_alike() -> None:
    """position_init=sinusoidal: the table starts at BERT's scale (std = initializer_range) and
    the dot product of two positions depends on their offset only, unlike a random table."""
    enc = Encoder(tiny(position_init="sinusoidal", max_len=32, embedding_size=16))
    table = enc.embeddings.position.weight.detach()
    assert table.std().item() == pytest.approx(0.02, rel=1e-3)
    gram = table @ table.T
    for offset in (1, 3):
        diagonal = torch.diagonal(gram, offset)
        assert torch.allclose(diagonal, diagonal[0].expand_as(diagonal), rtol=1e-3, atol=1e-6)
    random_gram = (lambda t: t @ t.T)(Encoder(tiny(max_len=32)).embeddings.position.weight.detach())
    assert torch.diagonal(random_gram, 1).std() > 10 * torch.diagonal(gram, 1).std()
    assert enc.embeddings.position.weight.requires_grad  # still learned


def test_sinusoidal_position_init_needs_absolute_positions() -> None:
    with pytest.raises(ConfigError, match=r"model\.position_init"):
        ModelConfig(position="relative", position_init="sinusoidal").validate("model")


def test_relative_positions_flops_match_the_counted_matmuls() -> None:
    """The analytic FLOPs of relative attention's extra position scores equal what torch's
    FLOP counter measures (forward, x3 for training), up to the per-batch W_R projection."""
    from torch.utils.flop_counter import FlopCounterMode

    from tibnlp.models.summary import training_flops_per_token

    n, rows = 16, 8
    ids, mask = batch([n] * rows, n)
    measured = []
    for position in ("absolute", "relative"):
        cfg = tiny(position=position, num_layers=2, hidden_size=24)
        with FlopCounterMode(display=False) as counter:
            Encoder(cfg)(ids, mask)
        measured.append(counter.get_total_flops() / (rows * n))
    analytic = [
        training_flops_per_token(tiny(position=p, num_layers=2, hidden_size=24), n, 0.15)
        for p in ("absolute", "relative")
    ]
    w_r = 2 * (2 * n - 1) * 24 * 24 * 2 / (rows * n)  # per token, per batch projection, 2 layers
    assert 3 * (measured[1] - measured[0]) == pytest.approx(analytic[1] - analytic[0] + 3 * w_r)
