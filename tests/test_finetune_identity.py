"""What counts as the same finished fine-tuning seed: a rerun reports a seed (not trains it
again) when its training is the same, however the command spelled the set it read."""

from __future__ import annotations

from pathlib import Path

from tests.test_finetune import _cfg, env  # noqa: F401  (the fixture)
from tibnlp.training.finetune import run_finetune


def _stamp(directory: Path) -> int:
    """When the seed's classifier was last written: unchanged when a rerun reports it."""
    return (directory / "model.safetensors").stat().st_mtime_ns


def test_a_config_naming_another_set_keys_its_seeds_by_the_set_read(env) -> None:  # noqa: F811
    """`finetune tncc -c FILE` whose file named another set read TNCC, but its seeds'
    fingerprint held the file's set: the same seeds under the plain command trained again."""
    named_other = _cfg(env, "finetune.epochs=1", "finetune.dataset=tusa")
    directory = run_finetune(named_other, "tncc").seeds[0].directory
    stamp = _stamp(directory)
    again = run_finetune(_cfg(env, "finetune.epochs=1"), "tncc")
    assert _stamp(directory) == stamp  # reported, not retrained
    assert again.seeds[0].directory == directory
