"""QA of `pretrain`, `finetune`, `export hf` on inputs a user gets wrong: a model folder whose
weights do not fit its model.yaml, the wrong kind of folder as --model, an output that holds
an earlier run, a resume past its max_steps or with changed settings, `--seeds 1,,2`. Each
fails with exit code 2 and a message naming the file or flag, and writes nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from ft_fixtures import make_vocab, pretrained_env
from tibetan_fixtures import prepared_inputs

from tibnlp.errors import DataError
from tibnlp.models.io import load_config_file


def _cli(argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    """Run the CLI's entry point: (exit code, stderr without whitespace)."""
    from tibnlp.cli import main as cli_main

    monkeypatch.setattr("sys.argv", ["tibnlp", *argv])
    with pytest.raises(SystemExit) as exit_:
        cli_main.main()
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return int(exit_.value.code or 0), "".join(err.replace("│", " ").split())


def _says(err: str, *texts: str) -> bool:
    """Every text is in `err` (compared without whitespace: rich wraps inside paths)."""
    return all("".join(t.split()) in err for t in texts)


def _edit_yaml(folder: Path, **changes: object) -> None:
    data = yaml.safe_load((folder / "model.yaml").read_text("utf-8"))
    data.update(changes)
    (folder / "model.yaml").write_text(yaml.safe_dump(data), "utf-8")


@pytest.fixture
def albert_dir(tmp_path: Path) -> Path:
    """A tiny exportable pretraining model directory (MLM + SOP heads) with its vocabulary."""
    import torch

    from tibnlp.config.model import HeadsConfig, ModelConfig
    from tibnlp.models.io import save_pretrained
    from tibnlp.models.pretraining import AlbertForPretraining
    from tibnlp.text.vocab import Vocabulary

    vocab = make_vocab(tmp_path / "vocab")
    cfg = ModelConfig(
        vocab_size=Vocabulary.load(vocab).size, embedding_size=8, hidden_size=16, num_layers=1,
        ffn_size=32, max_len=32, heads=HeadsConfig(small=2, large=2),
    )  # fmt: skip
    torch.manual_seed(0)
    out = save_pretrained(AlbertForPretraining(cfg).eval(), cfg, tmp_path / "run" / "model")
    for item in vocab.iterdir():
        shutil.copy2(item, out / item.name)
    return out


def test_finetune_model_whose_weights_do_not_fit_model_yaml(tmp_path, monkeypatch, capsys):
    """Was a load_state_dict RuntimeError traceback (exit 1) naming no file."""
    env = pretrained_env(tmp_path, monkeypatch)
    _edit_yaml(env.model, vocab_size=99)
    out = tmp_path / "runs"
    argv = ["finetune", "tncc", "--model", str(env.model), "-s", f"finetune.output={out}"]
    argv += ["-s", "engine.threads=1", "-s", "tracking.enabled=false"]
    code, err = _cli(argv, monkeypatch, capsys)
    assert code == 2
    assert _says(err, "model.safetensors does not match its model.yaml")
    assert _says(err, "embeddings.word.weight", "(model.yaml: [99, 8])")
    assert not out.exists()


def test_export_of_weights_that_do_not_fit_model_yaml_is_refused(albert_dir, monkeypatch, capsys):
    """Was "wrote ..." (exit 0) and a folder transformers refuses to load."""
    _edit_yaml(albert_dir, hidden_size=24)
    out = albert_dir.parent.parent / "hf"
    argv = ["export", "hf", "--model", str(albert_dir), "--output", str(out)]
    code, err = _cli(argv, monkeypatch, capsys)
    assert code == 2
    assert _says(err, "does not match its model.yaml", "(model.yaml: [24")
    assert not out.exists()


def test_export_into_the_model_folder_is_refused(albert_dir, monkeypatch, capsys):
    """Was written inside OUTPUT/model, where the next pretraining's model swap deletes it."""
    before = sorted(p.name for p in albert_dir.iterdir())
    out = albert_dir / "hf"
    argv = ["export", "hf", "--model", str(albert_dir), "--output", str(out)]
    code, err = _cli(argv, monkeypatch, capsys)
    assert code == 2 and _says(err, "is inside the model directory")
    assert sorted(p.name for p in albert_dir.iterdir()) == before


def test_a_checkpoint_or_hf_folder_as_model_says_what_it_is(albert_dir, tmp_path):
    run = albert_dir.parent
    tag = run / "checkpoints" / "step00000004"
    tag.mkdir(parents=True)
    (run / "checkpoints" / "latest").write_text("step00000004\n")
    for folder in (tag, run / "checkpoints"):
        with pytest.raises(DataError) as err:
            load_config_file(folder)
        assert f"the run's model is {albert_dir}" in str(err.value.hint)
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "tokenizer.json").write_text("{}")
    with pytest.raises(DataError) as err:
        load_config_file(hf)
    assert "Hugging Face export" in str(err.value.hint)


def test_seeds_with_an_empty_item_name_the_flag(tmp_path, monkeypatch, capsys):
    """Was a YAML parser message about an override the user never typed."""
    code, err = _cli(["finetune", "tncc", "--seeds", "1,,2"], monkeypatch, capsys)
    assert code == 2 and _says(err, "--seeds", "'1,,2' has an empty item")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepared_inputs(tmp_path_factory.mktemp("qa_pretrain"), n_docs=120, heldout=20)


def _pretrain_args(inputs: Path, out: Path, *extra: str) -> list[str]:
    sets = [
        "model.embedding_size=8", "model.hidden_size=16", "model.num_layers=1",
        "model.ffn_size=32", "model.max_len=64", "model.heads.small=2", "model.heads.large=2",
        "pretrain.seq_len=48", "pretrain.batch_size=8", "pretrain.eval_every=4",
        "pretrain.eval_batches=1", "pretrain.log_every=2", "pretrain.checkpoint_every=4",
        f"pretrain.corpus={inputs / 'corpus'}", f"pretrain.vocab={inputs / 'vocab'}",
        f"pretrain.output={out}", "engine.threads=1", "tracking.enabled=false", *extra,
    ]  # fmt: skip
    return ["pretrain", *(a for s in sets for a in ("-s", s))]


def test_init_from_weights_that_do_not_fit_model_yaml(albert_dir, inputs, monkeypatch, capsys):
    """Was a DeepSpeed-rank traceback after config.yaml and the tokenised data were written."""
    init = albert_dir.parent / "init"
    shutil.copytree(albert_dir, init)
    for item in (inputs / "vocab").iterdir():  # the run's own vocabulary
        shutil.copy2(item, init / item.name)
    _edit_yaml(init, hidden_size=24)
    out = albert_dir.parent / "pt"
    argv = _pretrain_args(inputs, out, f"pretrain.init_from={init}", "pretrain.max_steps=4")
    code, err = _cli(argv, monkeypatch, capsys)
    assert code == 2 and _says(err, "pretrain.init_from", "does not match its model.yaml")
    assert not (out / "config.yaml").exists() and not (out / "data").exists()


def test_a_new_run_over_an_earlier_runs_model_is_refused(inputs, tmp_path, monkeypatch, capsys):
    """Its checkpoints deleted (to save space), the earlier model was silently replaced."""
    model = tmp_path / "pt" / "model"
    model.mkdir(parents=True)
    (model / "model.yaml").write_text("keep")
    argv = _pretrain_args(inputs, tmp_path / "pt", "pretrain.max_steps=4")
    code, err = _cli(argv, monkeypatch, capsys)
    assert code == 2 and _says(err, f"{model} holds the model of an earlier run")
    assert sorted(p.name for p in model.parent.iterdir()) == ["model"]
    assert (model / "model.yaml").read_text() == "keep"


def test_resume_names_changed_settings_and_refuses_to_go_back(
    inputs, tmp_path, monkeypatch, capsys
):
    """A resume past its max_steps printed "8/4" and exited 0, keeping the 8-step model; other
    changed settings were taken without a word."""
    out = tmp_path / "pt"
    code, _ = _cli(_pretrain_args(inputs, out, "pretrain.max_steps=4"), monkeypatch, capsys)
    assert code == 0
    more = [*_pretrain_args(inputs, out, "pretrain.max_steps=6"), "--resume"]
    code, err = _cli(more, monkeypatch, capsys)
    assert code == 0 and _says(err, "pretrain.max_steps 6 (was 4)")
    saved = (out / "config.yaml").read_text()
    back = [*_pretrain_args(inputs, out, "pretrain.max_steps=2"), "--resume"]
    code, err = _cli(back, monkeypatch, capsys)
    assert code == 2 and _says(err, "at step 6, past max_steps 2")
    assert (out / "config.yaml").read_text() == saved
