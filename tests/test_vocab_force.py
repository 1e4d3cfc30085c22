"""`vocab build --force` replaces an earlier vocabulary folder, and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest
from tibetan_fixtures import write_prepared
from typer.testing import CliRunner

from tibnlp.cli.main import app
from tibnlp.config import VocabConfig
from tibnlp.errors import DataError
from tibnlp.text.vocab import Vocabulary
from tibnlp.text.vocab_build import build_vocabulary


def _config(size: int) -> VocabConfig:
    return VocabConfig(vocab_size=size, num_threads=1)


def test_force_replaces_an_earlier_vocabulary(tmp_path: Path) -> None:
    corpus = write_prepared(tmp_path / "prepared")
    out = tmp_path / "v"
    build_vocabulary(corpus, out, _config(200))
    with pytest.raises(DataError, match="already exists") as err:
        build_vocabulary(corpus, out, _config(150))
    assert "--force" in (err.value.hint or "")  # before: only "choose a new --output"
    build_vocabulary(corpus, out, _config(150), force=True)
    assert Vocabulary.load(out).size == 150
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prepared", "v"]  # nothing left over


def test_force_never_replaces_another_folder(tmp_path: Path) -> None:
    corpus = write_prepared(tmp_path / "prepared")
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(DataError, match="no vocabulary folder"):
        build_vocabulary(corpus, other, _config(200), force=True)
    assert (other / "keep.txt").read_text(encoding="utf-8") == "mine"


def test_the_cli_takes_force(tmp_path: Path) -> None:
    corpus = write_prepared(tmp_path / "prepared")
    args = ["vocab", "build", "--corpus", str(corpus), "--output", str(tmp_path / "v")]
    size = ["--vocab-size", "150", "-s", "vocab.num_threads=1"]
    assert CliRunner().invoke(app, [*args, *size]).exit_code == 0
    assert isinstance(CliRunner().invoke(app, [*args, *size]).exception, DataError)
    result = CliRunner().invoke(app, [*args, *size, "--force"])
    assert result.exit_code == 0, result.output
