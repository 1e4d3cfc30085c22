"""`tibnlp pretrain` as a researcher drives it on a CPU: --eval-only in a run's own folder,
--resume of a run that ended by its budget, Ctrl-C before the first checkpoint, an output
path that is a file, a held-out split smaller than a batch, export counts never reached, a
refused run's leftovers, --resume with other data settings, the skip-gram cache."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from tibetan_fixtures import TINY_MODEL, prepared_inputs, pretrain_config_file
from typer.testing import CliRunner

from tibnlp.cli.main import app
from tibnlp.config import load_config
from tibnlp.errors import ConfigError, DataError
from tibnlp.models import read_extra
from tibnlp.training import checkpoint

TINY: dict[str, dict[str, Any]] = {
    "model": TINY_MODEL,
    "pretrain": {
        "seq_len": 48,
        "batch_size": 8,
        "max_steps": 4,
        "eval_every": 2,
        "eval_batches": 1,
        "log_every": 2,
        "checkpoint_every": 2,
        "warn_after": 0.0,
    },
    "engine": {"threads": 1, "num_workers": 1},
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 60 documents, 10 held out: 276 training and 58 held-out examples at seq_len 48
    return prepared_inputs(tmp_path_factory.mktemp("qa_pretrain_inputs"), n_docs=60, heldout=10)


def _config(inputs: Path, out: Path, **pretrain: object) -> Path:
    return pretrain_config_file(inputs, out, TINY, experiment="qa-pt", **pretrain)


@pytest.fixture(scope="module")
def finished(inputs: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 4-step run (checkpoints at steps 2 and 4); tests work on copies of it."""
    from tibnlp.training.pretrain import run_pretraining

    out = tmp_path_factory.mktemp("qa_pretrain_finished") / "run"
    run_pretraining(load_config(_config(inputs, out)))
    return out


def _copy(run: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(run, out)
    shutil.copy(run.parent / "mlflow.db", tmp_path / "mlflow.db")  # the run its resume continues
    return out


def test_eval_only_in_a_runs_folder_leaves_its_config_and_its_resume(
    inputs: Path, finished: Path, tmp_path: Path
) -> None:
    """--eval-only wrote its own config over the training run's config.yaml (vocab_size and
    the resolved heads threshold, init_from): the run's next --resume was then refused as
    "the checkpoints hold another model than this config asks for"."""
    from tibnlp.training.pretrain import run_pretraining

    out = _copy(finished, tmp_path)
    saved = (out / "config.yaml").read_text()
    model = out / "model"
    cfg = load_config(_config(inputs, out), [f"pretrain.init_from={model}"])
    cfg.pretrain.vocab = str(model)
    scores = run_pretraining(cfg, eval_only=True)
    assert scores == out / "eval.json" and scores.is_file()
    assert (out / "config.yaml").read_text() == saved
    assert yaml.safe_load((out / "eval-config.yaml").read_text())["pretrain"]["init_from"]
    run_pretraining(load_config(_config(inputs, out, max_steps=6)), resume=True)
    assert checkpoint.latest_tag(out / "checkpoints") == "step00000006"


def test_resume_of_a_run_that_spent_its_token_budget_takes_no_step(
    inputs: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Each --resume of a run stopped by pretrain.max_tokens trained one more step past the
    budget and wrote it over OUTPUT/model (step 4, then 5, then 6, ...)."""
    from tibnlp.training.pretrain import run_pretraining

    out = tmp_path / "run"
    path = _config(inputs, out, max_steps=100, max_tokens=900)
    run_pretraining(load_config(path))
    first = read_extra(out / "model")
    assert first["stopped_by"] == "token_budget"
    assert first["schedule"] == {"schedule_clock": "tokens"}  # no time budget to lead
    tag = checkpoint.latest_tag(out / "checkpoints")
    capsys.readouterr()
    run_pretraining(load_config(path), resume=True)
    again = read_extra(out / "model")
    assert checkpoint.latest_tag(out / "checkpoints") == tag
    assert again["step"] == first["step"] and again["tokens"] == first["tokens"]
    assert again["stopped_by"] == "token_budget"
    err = " ".join(capsys.readouterr().err.split())
    assert "token budget" in err and "already spent" in err and "pretrain.max_tokens" in err
    # a larger budget trains on
    run_pretraining(load_config(path, ["pretrain.max_tokens=2000"]), resume=True)
    assert read_extra(out / "model")["step"] > first["step"]


def test_a_loop_resumed_past_its_time_budget_takes_no_step(tmp_path: Path) -> None:
    """The same for --time-budget: the loop looked at the clock only after a step."""
    from test_budget import _loop, _settings

    loop = _loop(tmp_path, _settings(tmp_path, time_budget_s=60.0), [])
    loop.step, loop.train_seconds = 7, 61.5  # as restored from a run the budget stopped
    result = loop.run()
    assert result.step == 7 and result.stopped_by == result.spent_before == "time_budget"
    loop.train_seconds = 30.0  # within its budget the run goes on
    loop.settings.max_steps = 9
    result = loop.run()
    assert result.step == 9 and not result.spent_before


def test_ctrl_c_before_the_first_checkpoint_says_to_start_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interrupted before any checkpoint, the command said the checkpoints stay and to run
    again with --resume, which then refused: "--resume: no complete checkpoint"."""
    import tibnlp.training.pretrain as pretrain

    def interrupted(*args: Any, **kwargs: Any) -> Path:
        raise KeyboardInterrupt

    monkeypatch.setattr(pretrain, "run_pretraining", interrupted)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "config.yaml").write_text("x: 1\n")
    result = CliRunner().invoke(app, ["pretrain", "-s", "pretrain.output=out"])
    assert result.exit_code == 130
    said = " ".join(result.output.split())
    assert "before the first checkpoint" in said and "without it to start over" in said
    assert "continue from the newest" not in said
    # with a checkpoint written, --resume is the way on
    (tmp_path / "out" / "checkpoints" / "step00000002").mkdir(parents=True)
    (tmp_path / "out" / "checkpoints" / "latest").write_text("step00000002\n")
    result = CliRunner().invoke(app, ["pretrain", "-s", "pretrain.output=out"])
    said = " ".join(result.output.split())
    assert result.exit_code == 130 and "with --resume" in said and "step00000002" in said


@pytest.mark.parametrize("below", [False, True], ids=["file", "under-a-file"])
def test_an_output_path_that_is_a_file_is_named(inputs: Path, tmp_path: Path, below: bool) -> None:
    """It failed with a FileExistsError / NotADirectoryError traceback from the folder lock."""
    from tibnlp.training.pretrain import run_pretraining

    afile = tmp_path / "afile"
    afile.write_text("x")
    out = afile / "run" if below else afile
    cfg = load_config(_config(inputs, tmp_path / "run"), [f"pretrain.output={out}"])
    with pytest.raises(ConfigError, match=r"'pretrain\.output'.*is not a folder") as err:
        run_pretraining(cfg)
    assert "folder path" in str(err.value.hint)
    assert afile.read_text() == "x"


def test_a_held_out_split_smaller_than_a_batch_is_said(
    inputs: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """58 held-out examples and batch_size 64: the run logged no eval/ metric and had no
    learning check, without a word."""
    from tibnlp.training.pretrain import run_pretraining

    out = tmp_path / "run"
    run_pretraining(load_config(_config(inputs, out, batch_size=64, max_steps=1)))
    err = " ".join(capsys.readouterr().err.split())
    assert "held-out split" in err and "58 examples" in err and "no eval/ metrics" in err
    assert "pretrain.batch_size=64" in err


def test_export_counts_never_reached_are_said(
    inputs: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """An export count past what the run trained on left no folder and no word."""
    from tibnlp.training.pretrain import run_pretraining

    out = tmp_path / "run"
    cfg = _config(inputs, out, max_steps=2, export_at_tokens=[100, 50_000_000])
    run_pretraining(load_config(cfg))
    assert [p.name for p in (out / "exports").iterdir()] == ["tokens-100"]
    err = " ".join(capsys.readouterr().err.split())
    assert "note: pretrain.export_at_tokens 50000000 not reached" in err


def test_a_batch_larger_than_the_corpus_leaves_no_config(inputs: Path, tmp_path: Path) -> None:
    """Refused, but config.yaml of a run that never started stayed behind."""
    from tibnlp.training.pretrain import run_pretraining

    out = tmp_path / "run"
    with pytest.raises(DataError, match=r"fewer than one batch \(pretrain\.batch_size=300\)"):
        run_pretraining(load_config(_config(inputs, out, batch_size=300)))
    assert not (out / "config.yaml").exists()


def test_eval_only_refused_for_a_small_held_out_split_writes_no_config(
    inputs: Path, finished: Path, tmp_path: Path
) -> None:
    from tibnlp.training.pretrain import run_pretraining

    out = tmp_path / "scores"
    model = finished / "model"
    cfg = load_config(_config(inputs, out, batch_size=64), [f"pretrain.init_from={model}"])
    cfg.pretrain.vocab = str(model)
    with pytest.raises(DataError, match=r"58 examples, fewer than one batch"):
        run_pretraining(cfg, eval_only=True)
    assert not any(out.glob("*config.yaml")) and not (out / "eval.json").exists()


def test_resume_with_other_data_settings_says_how_to_go_on(
    inputs: Path, finished: Path, tmp_path: Path
) -> None:
    """The hint was "choose another output folder or delete it": deleting data/ resumed the
    checkpoints' data position into other data."""
    from tibnlp.training.pretrain import run_pretraining

    out = _copy(finished, tmp_path)
    cfg = load_config(_config(inputs, out, max_steps=6, seq_len=32))
    with pytest.raises(DataError, match=r"--resume: .*data.* tokenised from other inputs") as e:
        run_pretraining(cfg, resume=True)
    hint = str(e.value.hint)
    assert str(out / "config.yaml") in hint and f"pretrain.init_from={out / 'model'}" in hint
    assert "delete" not in hint
    assert checkpoint.latest_tag(out / "checkpoints") == "step00000004"


def test_skipgram_cache_stopped_between_its_two_writes_is_not_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Vectors of settings B under the facts of settings A (a run stopped after writing the
    vectors) were read back as A's by the next run with A."""
    import torch

    from tibnlp.config.train import SkipgramConfig
    from tibnlp.training import skipgram

    seqs = [[5 + (i * 7 + j * 3) % 30 for j in range(12)] for i in range(60)]
    a = SkipgramConfig(epochs=1, window=2, negatives=2, batch_pairs=128, subsample=0)
    b = SkipgramConfig(epochs=2, window=2, negatives=2, batch_pairs=128, subsample=0)
    first = skipgram.cached_vectors(tmp_path, lambda: seqs, 40, 8, a, 0, {2, 3}, key="k")
    real_dumps = skipgram.json.dumps

    def stopped(*args: Any, **kwargs: Any) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(skipgram.json, "dumps", stopped)
    with pytest.raises(KeyboardInterrupt):
        skipgram.cached_vectors(tmp_path, lambda: seqs, 40, 8, b, 0, {2, 3}, key="k")
    monkeypatch.setattr(skipgram.json, "dumps", real_dumps)
    again = skipgram.cached_vectors(tmp_path, lambda: seqs, 40, 8, a, 0, {2, 3}, key="k")
    assert torch.equal(again.vectors, first.vectors)


def test_resume_with_changed_skipgram_settings_does_not_train_new_vectors(
    inputs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """On --resume the checkpoint's weights replace the embedding, yet a changed
    pretrain.skipgram trained new vectors first (minutes on a real corpus) and the model
    recorded that warm start's cost instead of the one it started from."""
    from tibnlp.training import skipgram
    from tibnlp.training.pretrain import run_pretraining

    out = tmp_path / "run"
    sg = {"epochs": 1, "window": 2, "negatives": 2, "batch_pairs": 512}
    run_pretraining(load_config(_config(inputs, out, max_steps=2, skipgram=sg)))
    first = read_extra(out / "model")

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("skip-gram trained again on --resume")

    monkeypatch.setattr(skipgram, "train_skipgram", refuse)
    capsys.readouterr()
    longer = _config(inputs, out, max_steps=4, skipgram={**sg, "epochs": 3})
    run_pretraining(load_config(longer), resume=True)
    facts = read_extra(out / "model")
    assert facts["step"] == 4 and facts["skipgram_flops"] == first["skipgram_flops"]
    assert "keeps the skip-gram vectors the run started from" in capsys.readouterr().err


def test_resume_with_another_batch_size_is_refused(
    inputs: Path, finished: Path, tmp_path: Path
) -> None:
    """The checkpoint's place in the data counts batches of the saved size: resumed with
    another, the run skipped or repeated examples with only a note among changed settings."""
    from tibnlp.training.pretrain import run_pretraining

    out = _copy(finished, tmp_path)
    path = _config(inputs, out, max_steps=6, batch_size=16)
    with pytest.raises(ConfigError, match=r"pretrain.batch_size 16 \(saved: 8\)") as err:
        run_pretraining(load_config(path), resume=True)
    assert "pretrain.init_from=" in (err.value.hint or "")
    assert checkpoint.latest_tag(out / "checkpoints") == "step00000004"
    # micro-batches of the same global batch may change
    path = _config(inputs, out, max_steps=6, micro_batch_size=4)
    run_pretraining(load_config(path), resume=True)
    assert checkpoint.latest_tag(out / "checkpoints") == "step00000006"
