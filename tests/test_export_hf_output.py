"""`tibnlp export hf --output`: a file, or a folder with files in it, is refused before the
model is read (no transformers or data needed)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tibnlp.cli.main import app
from tibnlp.errors import DataError


@pytest.mark.parametrize(
    ("output", "message"),
    [
        ("afile", r"afile is a file; give a folder path"),
        ("afile/out", r"cannot make folder .*afile/out: .*afile is a file"),
        ("full", r"full already exists and is not empty"),
    ],
)
def test_an_output_that_is_not_a_new_folder_is_refused(
    tmp_path: Path, output: str, message: str
) -> None:
    """`--output FILE` raised NotADirectoryError (from `iterdir`) after loading the model."""
    (tmp_path / "afile").write_text("keep")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep")
    args = ["export", "hf", "--model", str(tmp_path / "no-model")]
    result = CliRunner().invoke(app, [*args, "--output", str(tmp_path / output)])
    assert isinstance(result.exception, DataError), result.exception
    assert re.search(message, str(result.exception)), result.exception
    assert (tmp_path / "afile").read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "full"]


def test_an_electra_model_is_named_as_such() -> None:
    """An ELECTRA pretraining output was refused as 'an encoder-only or classifier directory'
    with the advice to export OUTPUT/model, the folder given."""
    import torch

    from tibnlp.config.model import ModelConfig
    from tibnlp.errors import DataError
    from tibnlp.export.hf_model import albert_state

    state = {"encoder.embeddings.word.weight": torch.zeros(2, 2), "rtd_out.weight": torch.zeros(1)}
    with pytest.raises(DataError, match="is an ELECTRA model") as err:
        albert_state(ModelConfig(), state, Path("out/model"))
    assert "pretrain.objective=mlm" in str(err.value.hint)
