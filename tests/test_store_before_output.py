"""`tibnlp pretrain` and `tibnlp finetune` open their tracking store before they tokenise or
write their output (`tracking.require_store`): a store that cannot be opened used to fail only
when the run opened, after config.yaml and data/ were written (pretrain) or the set was
tokenised (finetune). An unreachable server is not such a store: its run buffers, as before.
Each command's hint names the way it sets the store."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tibetan_fixtures import prepared_inputs, pretrain_config_file
from typer.testing import CliRunner

from tests.test_finetune import cfg_flags, env  # noqa: F401  (the fixture)
from tests.test_pretrain import TINY
from tibnlp.cli.main import app
from tibnlp.config import load_config
from tibnlp.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepared_inputs(tmp_path_factory.mktemp("store_inputs"), n_docs=60, heldout=10)


@pytest.fixture
def folder_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An mlruns folder: MLflow 3 refuses it unless MLFLOW_ALLOW_FILE_STORE is set."""
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    (tmp_path / "mlruns").mkdir()
    return tmp_path / "mlruns"


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_pretrain_with_a_store_that_cannot_open_writes_nothing(
    inputs: Path, tmp_path: Path, folder_store: Path
) -> None:
    """Exit 2, the key and the stage's own way to set it named, the output as it was (absent
    here; a folder of an earlier run keeps its files)."""
    out = tmp_path / "run"
    config = pretrain_config_file(inputs, out, TINY)
    child_env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "tibnlp.cli.main", "pretrain", "-c", str(config)]
    cmd += ["--set", f"tracking.uri={folder_store}"]
    done = subprocess.run(cmd, env=child_env, capture_output=True, text=True, timeout=600)
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 2, said
    assert f"cannot open the tracking store {folder_store} (config key 'tracking.uri')" in said
    assert "--set tracking.uri=sqlite:///mlflow.db" in said and "--tracking-uri" not in said
    assert not out.exists()

    out.mkdir()
    (out / "notes.txt").write_text("kept")
    file = tmp_path / "file"
    file.write_text("")
    bad = f"tracking.uri=sqlite:///{file}/mlflow.db"  # no folder can be made under a file
    result = CliRunner().invoke(app, ["pretrain", "-c", str(config), "--set", bad])
    exc = result.exception
    assert isinstance(exc, ConfigError) and "(config key 'tracking.uri')" in exc.message
    assert "--set tracking.uri=sqlite:///PATH/mlflow.db" in str(exc.hint)
    assert _files(out) == ["notes.txt"]


def test_finetune_with_a_store_that_cannot_open_stops_before_tokenising(
    env,  # noqa: F811
    folder_store: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tibnlp.training import finetune

    def tokenise(*_args: object) -> None:
        raise AssertionError("the set was tokenised before the store was opened")

    monkeypatch.setattr(finetune, "prepare", tokenise)
    tracked = ["tracking.enabled=true", f"tracking.uri={folder_store}"]
    sets = [a for s in cfg_flags(env, *tracked) for a in ("--set", s)]
    result = CliRunner().invoke(app, ["finetune", "tncc", "--seeds", "1", *sets])
    exc = result.exception
    assert result.exit_code != 0 and isinstance(exc, ConfigError), result.output
    assert f"{folder_store} (config key 'tracking.uri')" in exc.message
    assert "--set tracking.uri=sqlite:///mlflow.db" in str(exc.hint)
    assert "--tracking-uri" not in str(exc.hint)
    assert not (env.tmp / "runs").exists()


def test_an_unreachable_server_is_not_refused_first(env, tmp_path: Path) -> None:  # noqa: F811
    """A server that does not answer is an outage, not a bad store: the early check passes it,
    and the fine-tuning runs with its calls buffered."""
    from tibnlp.tracking import require_store
    from tibnlp.tracking.server import free_port
    from tibnlp.training.finetune import run_finetune

    away = f"http://127.0.0.1:{free_port()}"
    tracked = ["tracking.enabled=true", f"tracking.uri={away}"]
    buffered = [*tracked, f"tracking.buffer_dir={tmp_path / 'buf'}", "finetune.epochs=1"]
    cfg = load_config(None, cfg_flags(env, *buffered, "finetune.seeds=[1]"))
    require_store(cfg.tracking)
    with pytest.warns(UserWarning, match="unreachable"):
        result = run_finetune(cfg, "tncc")
    assert (result.output / "results.json").is_file()
    assert list((tmp_path / "buf").glob("*.jsonl"))  # kept for `tibnlp runs sync`


def test_each_command_s_hint_names_an_option_it_has(
    tmp_path: Path, folder_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The folder-store hint named `--tracking-uri` and, beside it, the stage commands' way:
    each command now gets the one it takes."""
    from tibnlp.tracking import Tracker

    with pytest.raises(ConfigError) as err:  # a stage's run (pretrain, finetune)
        Tracker("exp", uri=str(folder_store))
    assert "--set tracking.uri=sqlite:///mlflow.db" in str(err.value.hint)
    assert "--tracking-uri" not in str(err.value.hint)
    with pytest.raises(ConfigError) as err:  # `pipeline run --tracking-uri`
        Tracker("exp", uri=str(folder_store), uri_setting="--tracking-uri")
    assert "given by --tracking-uri" in err.value.message
    assert "(--tracking-uri sqlite:///mlflow.db)" in str(err.value.hint)
    monkeypatch.chdir(tmp_path)
    uri = f"file://{folder_store}"
    result = CliRunner().invoke(app, ["runs", "compare", "-e", "x", "--tracking-uri", uri])
    hint = str(getattr(result.exception, "hint", ""))
    assert "(--tracking-uri sqlite:///mlflow.db)" in hint and "--set" not in hint, result.output
