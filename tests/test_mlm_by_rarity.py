"""Rare-first masking in a real pretraining run (`pretrain.mask_rarity`), and
benchmarks/mlm_by_rarity.py, which scores held-out MLM accuracy by the masked piece's corpus
frequency."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from tibetan_fixtures import TINY_MLM_RUN, prepared_inputs, pretrain_config_file

from tibnlp.config import load_config
from tibnlp.data.masking import IGNORE_INDEX, MlmCollator
from tibnlp.data.pretraining import load_pretraining_dataset
from tibnlp.errors import DataError
from tibnlp.text.vocab import Vocabulary

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "mlm_by_rarity.py"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two tiny pretrainings on one corpus: uniform masks and rare-first masks."""
    from tibnlp.training.pretrain import run_pretraining

    root = tmp_path_factory.mktemp("rarity")
    inputs = prepared_inputs(root / "inputs", n_docs=60, heldout=20)
    out = {}
    for name, rarity in (("uniform", 0.0), ("rare", 1.0)):
        cfg = pretrain_config_file(inputs, root / name, TINY_MLM_RUN, "rarity", mask_rarity=rarity)
        out[name] = run_pretraining(load_config(cfg)).parent  # the pretraining output
    return out


def test_a_rare_first_run_trains_and_records_its_setting(runs: dict[str, Path]) -> None:
    client = MlflowClient(f"sqlite:///{runs['rare'].parent / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rarity")
    params = {
        r.data.params["pretrain.mask_rarity"] for r in client.search_runs([exp.experiment_id])
    }
    assert params == {"0.0", "1.0"}
    assert (runs["rare"] / "model" / "model.safetensors").is_file()


def test_the_bands_share_out_every_masked_held_out_piece(
    runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = tmp_path / "bands.md"
    models = [str(runs[name] / "model") for name in ("uniform", "rare")]
    argv = ["--corpus", str(runs["uniform"]), *models, "--rows", "16", "--out", str(table)]
    monkeypatch.setattr(sys, "argv", ["mlm_by_rarity.py", *argv])
    runpy.run_path(str(BENCH))["main"]()
    rows = [line for line in table.read_text().splitlines() if line.startswith("| /")]
    assert [row.split(" | ")[0][2:] for row in rows] == models
    # the masks are the script's (uniform, seed 123), the same for both models
    heldout = load_pretraining_dataset(runs["uniform"] / "data")[0]["heldout"]
    collate = MlmCollator(Vocabulary.load(models[0]), 0.3, 3, 123)
    n = min(16, len(heldout))
    masked = sum(
        int(
            (
                collate([heldout[i] for i in range(s, min(s + 64, n))], s)["mlm_labels"]
                != IGNORE_INDEX
            ).sum()
        )
        for s in range(0, n, 64)
    )
    for row in rows:
        cells = row.strip(" |").split(" | ")[2:]
        assert len(cells) == 4
        assert sum(int(c.split("(")[1].rstrip(")").replace(",", "")) for c in cells) == masked


def test_a_model_of_another_vocabulary_is_refused(
    runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.ft_fixtures import make_model_dir, make_vocab

    other = make_model_dir(tmp_path, make_vocab(tmp_path / "vocab"))
    argv = ["--corpus", str(runs["uniform"]), str(other)]
    monkeypatch.setattr(sys, "argv", ["mlm_by_rarity.py", *argv])
    with pytest.raises(DataError, match="another vocabulary"):
        runpy.run_path(str(BENCH))["main"]()
