"""Fine-tuning a pretrained encoder and what a user does with the result: a model folder whose
vocabulary is another run's, a rerun that resumes or retrains, and a Ctrl-C."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.ft_fixtures import make_vocab, pretrained_env, tiny_textcnn
from tibnlp.cli.main import app
from tibnlp.config import load_config
from tibnlp.data.tasks import load_classification
from tibnlp.errors import DataError
from tibnlp.models.io import load_config_file, save_pretrained
from tibnlp.text.vocab import Vocabulary
from tibnlp.training.finetune import run_finetune
from tibnlp.training.finetune_setup import prepare


def _recording(env) -> Path:
    """The tiny model folder, its weights saved as pretraining saves them: with the
    sha256 of the vocabulary they were trained with."""
    from tibnlp.models.encoder import Encoder

    cfg = load_config_file(env.model)
    sha = Vocabulary.load(env.vocab).sha256
    save_pretrained(Encoder(cfg), cfg, env.model, extra={"vocab_sha256": sha})
    return env.model


def _swap_vocab(model: Path, tmp: Path) -> None:
    """Another run's (smaller) vocabulary copied over the folder's own."""
    other = make_vocab(tmp / "other-vocab", size=40)
    for f in other.iterdir():
        shutil.copy2(f, model / f.name)


@pytest.mark.parametrize("init", ["pretrained", "random"])
def test_finetune_refuses_a_model_folder_holding_another_runs_vocabulary(
    tmp_path, monkeypatch, init
) -> None:
    env = pretrained_env(tmp_path, monkeypatch)
    model = _recording(env)
    flags = [f"finetune.model={model}", "finetune.encoder=albert", f"finetune.init={init}"]
    cfg = load_config(None, [*flags, "tracking.enabled=false"])
    data = load_classification("tncc", "title")
    prepare(cfg, data)  # its own vocabulary: accepted
    _swap_vocab(model, tmp_path)
    # before: fine-tuned silently, every id naming another piece than in pretraining
    with pytest.raises(DataError, match="is not the one the weights") as err:
        prepare(cfg, data)
    assert "model.safetensors" in err.value.message and "spm.model" in err.value.hint


def test_export_hf_refuses_a_model_folder_holding_another_runs_vocabulary(tmp_path) -> None:
    pytest.importorskip("tokenizers", reason="needs the hf extra: tibnlp[hf]")
    from tibnlp.config.model import HeadsConfig, ModelConfig
    from tibnlp.models.pretraining import AlbertForPretraining

    vocab_dir = make_vocab(tmp_path / "vocab")
    vocab = Vocabulary.load(vocab_dir)
    shape = {"embedding_size": 8, "hidden_size": 16, "num_layers": 1, "ffn_size": 32}
    cfg = ModelConfig(vocab_size=vocab.size, max_len=64, heads=HeadsConfig(2, 2), **shape)
    # weights pretrained with another vocabulary of the same size (as its record says)
    model = save_pretrained(
        AlbertForPretraining(cfg), cfg, tmp_path / "model", extra={"vocab_sha256": "ab" * 32}
    )
    for f in vocab_dir.iterdir():
        shutil.copy2(f, model / f.name)
    result = CliRunner().invoke(
        app, ["export", "hf", "--model", str(model), "--output", str(tmp_path / "hf")]
    )
    assert isinstance(result.exception, DataError), result.output  # main(): exit 2
    assert "is not the one the weights" in result.exception.message
    assert not (tmp_path / "hf").exists()


def test_rerun_says_which_seeds_it_reuses_and_which_it_trains_again(
    tmp_path, monkeypatch, capsys
) -> None:
    env = pretrained_env(tmp_path, monkeypatch)
    flags = tiny_textcnn(env.vocab, tmp_path / "runs", "finetune.epochs=1")
    run_finetune(load_config(None, [*flags, "finetune.seeds=[1]"]), "tncc")
    assert "seed 1:" not in capsys.readouterr().err  # a first run: nothing to say
    run_finetune(load_config(None, [*flags, "finetune.seeds=[1,2]"]), "tncc")
    err = capsys.readouterr().err
    assert "seed 1: finished earlier" in err and "not retrained" in err
    assert "seed 2:" not in err  # trained for the first time
    run_finetune(load_config(None, [*flags, "finetune.seeds=[1]", "finetune.dropout=0.3"]), "tncc")
    assert "seed 1:" in (err := capsys.readouterr().err) and "training it again" in err


@pytest.mark.parametrize("how", ["--set", "-c"])
def test_classify_reads_the_task_the_config_sets(tmp_path, monkeypatch, how) -> None:
    """`finetune classify --dataset tncc` with finetune.task=document (from --set, or a config
    file that `finetune tncc -c` reads the same way) trained and reported the title task, with
    the run's logged params saying document."""
    asked = []

    def run(cfg, dataset, task="title", wait=False):
        asked.append((dataset, task, cfg.finetune.task))
        raise KeyboardInterrupt

    monkeypatch.setattr("tibnlp.cli.finetune.run_finetune", run)
    config = tmp_path / "doc.yaml"
    config.write_text("finetune:\n  dataset: tncc\n  task: document\n", "utf-8")
    args = ["-s", "finetune.task=document"] if how == "--set" else ["-c", str(config)]
    CliRunner().invoke(app, ["finetune", "classify", "--dataset", "tncc", *args])
    assert asked == [("tncc", "document", "document")]


def test_ctrl_c_during_finetune_says_what_stays_and_exits_130(tmp_path, monkeypatch) -> None:
    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("tibnlp.cli.finetune.run_finetune", interrupted)
    out = tmp_path / "runs"
    args = ["finetune", "tncc", "--vocab", str(tmp_path), "-s", f"finetune.output={out}"]
    result = CliRunner().invoke(app, [*args, "-s", "tracking.enabled=false"])
    assert result.exit_code == 130
    assert "interrupted" in result.output and str(out) in result.output.replace("\n", "")
    assert "not retrained" in result.output and "starts over" in result.output


def test_model_yaml_edited_to_another_depth_is_named_with_a_hint(tmp_path, monkeypatch) -> None:
    from tibnlp.models.io import load_encoder

    env = pretrained_env(tmp_path, monkeypatch)
    yaml_file = env.model / "model.yaml"
    text = yaml_file.read_text(encoding="utf-8")
    assert "num_layers: 1\n" in text and "share_layers: true\n" in text
    # unshared layers: tensors the weights do not have (shared, only the depth is in the yaml)
    text = text.replace("num_layers: 1\n", "num_layers: 3\n")
    yaml_file.write_text(text.replace("share_layers: true", "share_layers: false"), "utf-8")
    # (the depth recorded in the weights is named first; weights saved before it was
    # recorded are caught by their tensors: "missing ...")
    with pytest.raises(DataError, match=r"does not match its model\.yaml: the weights") as err:
        load_encoder(env.model)
    assert "mixes two models" in err.value.hint  # before: no hint at all


def test_pretrain_init_from_refuses_a_model_folder_holding_another_runs_vocabulary(
    tmp_path,
) -> None:
    # before: the folder's vocabulary only had to equal pretrain.vocab, so a folder whose
    # vocabulary had been swapped for another run's continued pretraining on the wrong ids
    from tibnlp.config.model import HeadsConfig, ModelConfig
    from tibnlp.models.pretraining import AlbertForPretraining
    from tibnlp.training.pretrain_init import initial_weights

    vocab_dir = make_vocab(tmp_path / "vocab")
    vocab = Vocabulary.load(vocab_dir)
    shape = {"embedding_size": 8, "hidden_size": 16, "num_layers": 1, "ffn_size": 32}
    cfg = ModelConfig(vocab_size=vocab.size, max_len=64, heads=HeadsConfig(2, 2), **shape)
    model = save_pretrained(
        AlbertForPretraining(cfg), cfg, tmp_path / "model", extra={"vocab_sha256": vocab.sha256}
    )
    for f in vocab_dir.iterdir():
        shutil.copy2(f, model / f.name)
    assert initial_weights(model, vocab, vocab_dir)[0].vocab_size == vocab.size  # its own
    save_pretrained(AlbertForPretraining(cfg), cfg, model, extra={"vocab_sha256": "ab" * 32})
    with pytest.raises(DataError, match="is not the one the weights"):
        initial_weights(model, vocab, vocab_dir)


def test_a_model_folder_without_its_vocabulary_files_is_told_to_be_copied_whole(
    tmp_path,
) -> None:
    # before: "build one with `tibnlp vocab build`", which cannot give the weights' ids back
    vocab_dir = make_vocab(tmp_path / "vocab")
    with pytest.raises(DataError) as plain:
        Vocabulary.load(tmp_path)  # a folder that is no model: build a vocabulary
    assert "tibnlp vocab build" in (plain.value.hint or "")
    model = tmp_path / "model"
    model.mkdir()
    for f in vocab_dir.iterdir():
        shutil.copy2(f, model / f.name)
    (model / "model.yaml").write_text("hidden_size: 16\n")
    (model / "spm.model").unlink()
    with pytest.raises(DataError, match=r"no spm\.model") as err:
        Vocabulary.load(model)
    assert "copy the folder whole" in (err.value.hint or "")
    assert "vocab build" not in (err.value.hint or "")
