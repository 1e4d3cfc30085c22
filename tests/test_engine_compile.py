"""`engine.compile`: the model compiled in place inside the DeepSpeed engine, through a real
pretraining run. Checked with the `aot_eager` backend (the traced graph run by eager kernels),
so the numbers must be eager's; what compiling buys is a GPU question (gpu.md)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch._dynamo as dynamo
import yaml
from safetensors.torch import load_file
from test_pretrain import _config_file, inputs  # noqa: F401  (module fixture: corpus + vocabulary)
from torch._dynamo.utils import counters

from tibnlp.config import load_config
from tibnlp.models.pretraining import DYNAMO_CAPTURE


def test_engine_compile_trains_and_exports_like_eager(
    inputs: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """`engine.compile` through a real pretraining run (the traced graph run by eager kernels):
    the same losses and exported weights as eager, and the same state_dict keys (the module
    is compiled in place, so checkpoints and exports do not see it)."""
    keep = {k: getattr(dynamo.config, k) for k in [*DYNAMO_CAPTURE, "recompile_limit"]}
    with dynamo.config.patch(**keep):  # the engine sets them globally; restored after the test
        weights, graphs = _run_both(inputs, tmp_path)
    assert graphs.keys() == {"off", "aot_eager"}
    assert graphs["off"] == 0 and graphs["aot_eager"] >= 1
    assert weights["off"].keys() == weights["aot_eager"].keys()
    for key, value in weights["off"].items():
        torch.testing.assert_close(weights["aot_eager"][key], value, rtol=1e-4, atol=1e-5)


def _run_both(inputs: Path, tmp_path: Path) -> tuple[dict, dict]:  # noqa: F811
    from tibnlp.training.pretrain import run_pretraining

    weights, graphs = {}, {}
    for mode in ("off", "aot_eager"):
        out = tmp_path / mode
        path = _config_file(inputs, out, max_steps=4, eval_every=4, checkpoint_every=4)
        data = yaml.safe_load(path.read_text())
        data["engine"] = {"threads": 1, "compile": mode}
        path.write_text(yaml.safe_dump(data))
        dynamo.reset()
        counters.clear()
        run_pretraining(load_config(path))
        graphs[mode] = counters["stats"]["unique_graphs"]
        weights[mode] = load_file(out / "model" / "model.safetensors")
    return weights, graphs
