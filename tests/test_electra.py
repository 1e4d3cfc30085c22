"""Replaced-token detection (`pretrain.objective: electra`): what the discriminator is told,
what a model directory holds, and a run from config to a directory `finetune --model` reads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from design_models import tiny
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file
from test_pretrain import _config_file
from tibetan_fixtures import prepared_inputs

from tibnlp.config import load_config
from tibnlp.config.model import HeadsConfig
from tibnlp.errors import ConfigError
from tibnlp.models import read_extra
from tibnlp.models.electra import TIED_KEY, ElectraForPretraining, generator_config
from tibnlp.models.io import load_encoder, save_pretrained
from tibnlp.models.summary import electra_flops_per_token, training_flops_per_token

CFG = tiny(
    vocab_size=60,
    embedding_size=16,
    ffn_size=64,
    norm="pre",
    position="relative",
    share_layers=False,
    heads=HeadsConfig(small=4, large=4, threshold=0),
    initializer_range=0.02,
)


def _batch(seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, CFG.vocab_size, (4, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[3, 8:] = 0
    labels = torch.full_like(ids, -100)
    for col in (2, 5, 6):
        labels[:, col] = ids[:, col]
    inputs = ids.masked_fill(labels != -100, 4)  # [MASK]
    return inputs, mask, labels, ids


def test_generator_is_narrower_with_head_width_kept() -> None:
    gen = generator_config(CFG, 0.5)
    assert (gen.hidden_size, gen.ffn_size, gen.num_layers) == (16, 32, 2)
    assert gen.heads.small == gen.heads.large == 2  # 8-wide heads, as the encoder's
    assert generator_config(CFG, 0.25).heads.small == 1


def test_discriminator_is_told_exactly_which_tokens_were_replaced() -> None:
    """Replacements happen only at masked positions; a sample equal to the original counts as
    original (the paper's labels), and every real token is judged."""
    torch.manual_seed(0)
    model = ElectraForPretraining(CFG)
    inputs, mask, labels, ids = _batch()
    seen: dict[str, torch.Tensor] = {}

    def grab(_module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        seen["corrupted"] = args[0]

    model.encoder.register_forward_pre_hook(grab)
    out = model(inputs, mask, None, labels)
    corrupted = seen["corrupted"]
    masked = labels != -100
    assert torch.equal(corrupted[~masked], ids[~masked])  # untouched outside the masks
    replaced = (corrupted != ids)[mask.bool()].float()
    assert out["replaced_share"].item() == pytest.approx(replaced.mean().item())
    assert 0 < out["replaced_share"].item() < 1  # an untrained generator misses most
    # a generator that always predicts the original replaces nothing
    with torch.no_grad():
        model.generator.mlm_bias.fill_(-1e4)
        model.generator.mlm_bias[7] = 1e4
    out = model(inputs, mask, None, labels.masked_fill(masked, 7))
    assert out["replaced_share"].item() == 0.0
    assert out["mask_accuracy"].item() == 1.0


def test_loss_trains_generator_and_discriminator_through_one_tied_embedding() -> None:
    torch.manual_seed(0)
    model = ElectraForPretraining(CFG, rtd_weight=50.0)
    assert model.generator.encoder.embeddings.word is model.encoder.embeddings.word
    inputs, mask, labels, _ = _batch()
    out = model(inputs, mask, None, labels)
    expected = out["mask_loss"] + 50.0 * out["rtd_loss"]
    assert out["loss"].item() == pytest.approx(expected.item(), rel=1e-6)
    out["loss"].backward()
    for name in ("encoder.later_layers.0.ffn_out.weight", "generator.mlm_bias", "rtd_out.bias"):
        param = dict(model.named_parameters()).get(name)
        if param is not None:
            assert param.grad is not None and param.grad.abs().sum() > 0, name
    assert model.encoder.embeddings.word.weight.grad.abs().sum() > 0


def test_model_directory_holds_the_discriminator_where_finetuning_reads_it(
    tmp_path: Path,
) -> None:
    torch.manual_seed(0)
    model = ElectraForPretraining(CFG)
    save_pretrained(model, CFG, tmp_path / "m")
    state = load_file(tmp_path / "m" / "model.safetensors")
    assert TIED_KEY not in state and any(k.startswith("generator.") for k in state)
    _, encoder = load_encoder(tmp_path / "m")
    for key, value in encoder.state_dict().items():
        assert torch.equal(value, model.encoder.state_dict()[key]), key
    again = ElectraForPretraining(CFG)
    again.load_state_dict(state)  # strict: the tied key is restored from the encoder's
    assert again.generator.encoder.embeddings.word is again.encoder.embeddings.word
    assert torch.equal(again.generator.mlm_bias, model.generator.mlm_bias)


def test_flops_count_both_networks() -> None:
    mlm = training_flops_per_token(CFG, 32, 0.3)
    rtd = electra_flops_per_token(CFG, 32, 0.3, 0.5)
    generator = training_flops_per_token(generator_config(CFG, 0.5), 32, 0.3)
    head = 6.0 * (32 * 32 + 32)  # the detection head; no vocabulary projection
    assert rtd - generator - training_flops_per_token(CFG, 32, 0.0) == pytest.approx(head)
    assert mlm < rtd < 2 * mlm


def test_electra_with_sentence_order_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"pretrain": {"objective": "electra", "sop": True}}))
    with pytest.raises(ConfigError, match=r"pretrain\.sop"):
        load_config(path)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepared_inputs(tmp_path_factory.mktemp("electra_inputs"), n_docs=120, heldout=30)


def test_electra_run_writes_a_model_finetuning_reads_and_continues(
    inputs: Path, tmp_path: Path
) -> None:
    from tibnlp.training.pretrain import run_pretraining

    electra = {"objective": "electra", "sop": False, "mask_prob": 0.3}
    first = run_pretraining(load_config(_config_file(inputs, tmp_path / "a", **electra)))
    facts = read_extra(first)
    assert facts["objective"] == "electra" and facts["step"] == 12
    _, encoder = load_encoder(first)  # what `finetune --model` builds on
    assert sum(p.numel() for p in encoder.parameters()) > 0
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("pt-tests").experiment_id])
    for name in ("rtd_loss", "rtd_accuracy", "replaced_share", "mask_accuracy"):
        assert f"eval/{name}" in run.data.metrics and f"train/{name}" in run.data.metrics

    cont = load_config(
        _config_file(inputs, tmp_path / "b", max_steps=2, init_from=str(first), **electra)
    )
    cont.pretrain.vocab = str(first)
    cont.pretrain.optimizer.lr = 1e-9
    cont.pretrain.optimizer.warmup_steps = 0
    second = run_pretraining(cont)
    before, after = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    assert set(after) == set(before)
    for key, value in after.items():
        torch.testing.assert_close(value, before[key], rtol=0, atol=1e-6)

    mlm = load_config(_config_file(inputs, tmp_path / "c", sop=False, init_from=str(first)))
    mlm.pretrain.vocab = str(first)
    with pytest.raises(ConfigError, match="objective electra") as err:
        run_pretraining(mlm)
    assert "pretrain.objective=electra" in str(err.value.hint)


def test_an_mlm_encoder_starts_an_electra_run_as_its_discriminator(
    inputs: Path, tmp_path: Path
) -> None:
    from tibnlp.training.pretrain import run_pretraining

    mlm = run_pretraining(
        load_config(_config_file(inputs, tmp_path / "mlm", sop=False, max_steps=4))
    )
    cfg = load_config(
        _config_file(
            inputs,
            tmp_path / "rtd",
            objective="electra",
            sop=False,
            max_steps=2,
            init_from=str(mlm),
        )
    )
    cfg.pretrain.vocab = str(mlm)
    cfg.pretrain.optimizer.lr = 1e-9
    cfg.pretrain.optimizer.warmup_steps = 0
    rtd = run_pretraining(cfg)
    before, after = load_file(mlm / "model.safetensors"), load_file(rtd / "model.safetensors")
    encoder = {k for k in before if k.startswith("encoder.")}
    assert encoder and encoder <= set(after)
    for key in encoder:
        torch.testing.assert_close(after[key], before[key], rtol=0, atol=1e-6)
    assert any(k.startswith("generator.") for k in after)  # started fresh beside it
    assert read_extra(rtd)["tokens"] > read_extra(mlm)["tokens"]
