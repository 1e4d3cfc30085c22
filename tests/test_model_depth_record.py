"""The depth a model was trained at travels in its weights: shared layers hold one layer's
tensors for any depth, so a `model.yaml` edited to another depth would load and run it."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file, save_file

from tests.ft_fixtures import pretrained_env
from tibnlp.errors import DataError
from tibnlp.models.io import WEIGHTS, load_encoder, load_pretrained


def test_shared_layer_model_edited_to_another_depth_is_refused(tmp_path, monkeypatch) -> None:
    env = pretrained_env(tmp_path, monkeypatch)
    yaml_file = env.model / "model.yaml"
    text = yaml_file.read_text(encoding="utf-8")
    assert "num_layers: 1\n" in text and "share_layers: true\n" in text
    cfg, _ = load_encoder(env.model)  # as saved: loads
    assert cfg.num_layers == 1
    yaml_file.write_text(text.replace("num_layers: 1\n", "num_layers: 3\n"), "utf-8")
    # before: loaded, and the one shared layer ran three times
    with pytest.raises(DataError, match=r"trained with num_layers: 1.*says num_layers: 3") as err:
        load_encoder(env.model)
    assert "mixes two models" in err.value.hint


def test_weights_saved_before_the_depth_was_recorded_still_load(tmp_path, monkeypatch) -> None:
    env = pretrained_env(tmp_path, monkeypatch)
    weights = env.model / WEIGHTS
    save_file(load_file(weights), str(weights), metadata={"format": "pt"})
    cfg, state = load_pretrained(env.model)
    assert cfg.num_layers == 1 and state
