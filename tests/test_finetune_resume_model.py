"""A finished seed is reused only if the encoder weights it was fine-tuned from are the same."""

from __future__ import annotations

import torch

from tests.ft_fixtures import make_model_dir
from tests.test_finetune import _cfg, env  # noqa: F401  (fixture)
from tibnlp.models.encoder import Encoder
from tibnlp.models.io import load_config_file, save_pretrained
from tibnlp.training.finetune import run_finetune


def test_rerun_after_the_model_folder_changed_trains_again(env) -> None:  # noqa: F811
    model = make_model_dir(env.tmp, env.vocab)
    albert = ("finetune.encoder=albert", f"finetune.model={model}", "finetune.vocab=")
    cfg = _cfg(env, *albert, "finetune.epochs=1")
    first = run_finetune(cfg, "tncc")
    weights = first.seeds[0].directory / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert run_finetune(cfg, "tncc").aggregate == first.aggregate  # same weights: resumed
    assert weights.stat().st_mtime_ns == stamp
    # the same folder now holds other weights (as after `tibnlp pretrain --resume`)
    model_cfg = load_config_file(model)
    torch.manual_seed(1234)
    save_pretrained(Encoder(model_cfg), model_cfg, model)
    run_finetune(cfg, "tncc")
    assert weights.stat().st_mtime_ns != stamp  # fine-tuned again, from the new weights
