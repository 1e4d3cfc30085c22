"""Config and CLI input handling: what a user types reaches the config as typed, impossible
combinations fail at load (or before anything is written), and CLI mistakes exit cleanly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.ft_fixtures import make_vocab
from tibnlp.cli.main import app
from tibnlp.config import load_config
from tibnlp.errors import ConfigError, DataError


def test_string_keys_keep_the_text_typed() -> None:
    """YAML reads 2024.10 as 2024.1, 0755 as 493 (octal), 2024-01-01 as a date: a string key
    set with --set (or a command's own string flag) must get the text as typed."""
    cfg = load_config(
        None,
        [
            "tracking.experiment=2024.10",
            "finetune.vocab=0755",
            "finetune.model=2024-01-01",
            "tracking.tags.version=1.10",
        ],
    )
    assert cfg.tracking.experiment == "2024.10"
    assert cfg.finetune.vocab == "0755"
    assert cfg.finetune.model == "2024-01-01"
    assert cfg.tracking.tags == {"version": "1.10"}
    # numbers still reach number keys as numbers
    assert load_config(None, ["pretrain.optimizer.lr=1e-3"]).pretrain.optimizer.lr == 1e-3


def test_time_budget_flag_is_not_read_as_base_60(monkeypatch) -> None:
    """`--time-budget 1:30` was YAML's sexagesimal 90, silently a 90-second budget."""
    import tibnlp.training.pretrain as pretrain_module

    seen = []
    monkeypatch.setattr(pretrain_module, "run_pretraining", lambda cfg, **kw: seen.append(cfg))
    result = CliRunner().invoke(app, ["pretrain", "--time-budget", "1:30"])
    assert not seen, f"ran with time_budget={seen[0].pretrain.time_budget!r}"
    assert isinstance(result.exception, ConfigError)
    assert "pretrain.time_budget" in str(result.exception)


def test_an_empty_section_keeps_the_fields_own_default(tmp_path: Path) -> None:
    """`finetune: {optimizer: }` (keys commented out) must not swap finetune's lr 5e-5 for
    OptimizerConfig's class default 1e-3."""
    path = tmp_path / "c.yaml"
    path.write_text("finetune:\n  optimizer:\n    # lr: 1e-4\n")
    cfg = load_config(path)
    assert cfg.finetune.optimizer.lr == pytest.approx(5e-5)
    assert cfg.finetune.optimizer.warmup_steps == 0


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("pretrain.optimizer.betas=[2, 3]", "pretrain.optimizer.betas"),
        ("finetune.optimizer.betas=[0.9, 1.0]", "finetune.optimizer.betas"),
        ("pretrain.optimizer.eps=-1", "pretrain.optimizer.eps"),
        ("pretrain.optimizer.weight_decay=-0.1", "pretrain.optimizer.weight_decay"),
        ("pretrain.time_budget=nan", "pretrain.time_budget"),
    ],
)
def test_impossible_values_fail_at_load(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, [override])


def test_seq_len_above_max_len_fails_before_writing(tmp_path: Path) -> None:
    """Crashed with a ValueError traceback at the first step, after tokenising the corpus."""
    from tibnlp.training.pretrain import run_pretraining

    out = tmp_path / "run"
    cfg = load_config(
        None,
        [
            f"pretrain.vocab={make_vocab(tmp_path / 'vocab')}",
            f"pretrain.corpus={tmp_path / 'corpus'}",
            f"pretrain.output={out}",
            "pretrain.seq_len=128",
            "model.max_len=64",
            "tracking.enabled=false",
        ],
    )
    with pytest.raises(ConfigError, match=r"pretrain\.seq_len"):
        run_pretraining(cfg)
    assert not out.exists()  # not even empty: the lock removes the folder it made


def test_duplicate_yaml_key_names_file_and_line(tmp_path: Path) -> None:
    """A second `pretrain:` silently replaced the first one's settings."""
    path = tmp_path / "dup.yaml"
    path.write_text(
        "pretrain:\n  max_steps: 100\nmodel:\n  max_len: 64\npretrain:\n  seq_len: 64\n"
    )
    with pytest.raises(ConfigError, match=r"dup\.yaml:5.*pretrain"):
        load_config(path)
    # merge keys stay allowed, and a key may override what a merge brought in
    path.write_text("a: &a {seq_len: 64}\npretrain:\n  <<: *a\n  seq_len: 32\n")
    from tibnlp.config.yaml_loader import read_yaml

    assert read_yaml(path)["pretrain"] == {"seq_len": 32}


@pytest.mark.parametrize(
    "command", [["pretrain", "-c"], ["finetune", "tncc", "--config"], ["pipeline", "run"]]
)
def test_a_config_folder_is_named_a_folder(tmp_path: Path, command: list[str]) -> None:
    """`-c SOMEDIR` said "config file SOMEDIR does not exist": it exists, as a folder."""
    folder = tmp_path / "configs"
    folder.mkdir()
    result = CliRunner().invoke(app, [*command, str(folder)])
    assert result.exit_code != 0
    error = result.exception
    assert isinstance(error, DataError), result.output  # as for a missing file
    assert f"{folder} is a directory" in error.message and "does not exist" not in error.message
    assert "YAML file" in (error.hint or "")


def test_runs_sync_of_a_missing_buffer_is_an_error(tmp_path: Path) -> None:
    """`runs sync TYPO` said "replayed 0 ... 0 left" and exited 0: the buffer never replayed."""
    result = CliRunner().invoke(app, ["runs", "sync", str(tmp_path / "no-such-buffer")])
    assert isinstance(result.exception, DataError), result.output
    assert "no-such-buffer" in str(result.exception)


def test_an_override_error_does_not_blame_the_file(tmp_path: Path) -> None:
    """`-c tiny.yaml --time-budget 1:30` said "tiny.yaml: config key 'pretrain.time_budget'",
    sending the user to a file that does not set it."""
    path = tmp_path / "tiny.yaml"
    path.write_text("pretrain:\n  max_steps: 5\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, ["pretrain.optimizer.lr=0"])
    assert "tiny.yaml" not in info.value.message
    assert "'pretrain.optimizer.lr'" in info.value.message
    path.write_text("pretrain:\n  max_steps: 0\n")  # the file's own error still names it
    with pytest.raises(ConfigError, match=r"tiny\.yaml: config key 'pretrain\.max_steps'"):
        load_config(path, ["pretrain.optimizer.lr=0.1"])


def test_a_conflict_with_an_override_names_the_file_and_the_set_key(tmp_path: Path) -> None:
    """lamb from the file with `--set engine.zero_stage=1`: both halves of the conflict are
    named, not the file alone."""
    path = tmp_path / "paper.yaml"
    path.write_text("pretrain:\n  optimizer: {name: lamb}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, ["engine.zero_stage=1", "pretrain.max_steps=5"])
    assert info.value.message.startswith(f"{path} with --set engine.zero_stage: config key")
    assert "pretrain.max_steps" not in info.value.message


def test_yaml_numbers_follow_yaml_1_2(tmp_path: Path) -> None:
    """PyYAML reads YAML 1.1: `1:30` is the base-60 int 90 (a time budget of 90 seconds),
    `0755` octal, `2024-01-01` a date and `1e-3` a string. Files and --set values (pipelines
    too) read numbers as YAML 1.2 does."""
    from tibnlp.config.yaml_loader import parse_override, read_yaml

    values = {"1:30": "1:30", "0755": 755, "2024-01-01": "2024-01-01", "1e-3": 1e-3}
    values |= {"6e6": 6e6, "1_000": 1000, "0x1F": 31, "-2": -2, ".5": 0.5, "true": True}
    for text, value in values.items():
        assert parse_override(f"a.b={text}")[1] == value, text
    path = tmp_path / "c.yaml"
    path.write_text("pretrain:\n  time_budget: 1:30\n  max_steps: 0755\n", encoding="utf-8")
    assert read_yaml(path)["pretrain"] == {"time_budget": "1:30", "max_steps": 755}
    with pytest.raises(ConfigError, match="'1:30' is not a duration"):
        load_config(path)


def test_runs_sync_leaves_a_file_that_is_not_a_buffer_alone(tmp_path: Path) -> None:
    """`runs sync notes.txt` read no record from it, removed it as 'sent' and exited 0; a
    JSONL file of other records crashed on `rec['op']`; a folder lost its non-buffer *.jsonl."""
    text = tmp_path / "notes.txt"
    text.write_text("x\n", encoding="utf-8")
    other = tmp_path / "titles.jsonl"
    other.write_text('{"text": "a", "label": 1}\n', encoding="utf-8")
    for path in (text, other):
        result = CliRunner().invoke(app, ["runs", "sync", str(path)])
        assert isinstance(result.exception, DataError), result.output
        assert "is not a tibnlp tracking buffer" in str(result.exception) and path.exists()
    (tmp_path / "x.db").touch()  # the store to replay into (sync makes none)
    result = CliRunner().invoke(
        app, ["runs", "sync", str(tmp_path), "--tracking-uri", f"sqlite:///{tmp_path / 'x.db'}"]
    )
    assert result.exit_code == 0, result.output
    assert "replayed 0" in result.output and text.exists() and other.exists()


def test_runs_sync_drops_an_artifact_gone_since_and_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A buffered log_artifact whose file was moved away counted as an outage (FileNotFoundError
    is an OSError): every sync said 'the store is still unreachable' and never finished."""
    from tibnlp.tracking import Tracker
    from tibnlp.tracking.replay import Applier

    monkeypatch.chdir(tmp_path)
    uri, buf = f"sqlite:///{tmp_path / 'm.db'}", tmp_path / "buf"
    real_apply = Applier.apply

    def down(self: Applier, rec: dict) -> None:
        raise ConnectionError("store down")

    monkeypatch.setattr(Applier, "apply", down)
    art = tmp_path / "a.txt"
    art.write_text("a", encoding="utf-8")
    with pytest.warns(UserWarning):
        tr = Tracker("e", "r", uri=uri, buffer_dir=buf, retry_seconds=3600)
    tr.log_artifact(art)
    tr.log_metrics({"m": 1.0}, step=1)
    tr.end()
    monkeypatch.setattr(Applier, "apply", real_apply)
    art.unlink()  # the file moved away: a copy taken when it was buffered is uploaded
    lines = [line for f in buf.glob("*.jsonl") for line in f.read_text("utf-8").splitlines()]
    (copy,) = [json.loads(line)["path"] for line in lines if '"log_artifact"' in line]
    shutil.rmtree((buf / copy).parent)  # and that copy gone too (kept relative to the buffer)
    result = CliRunner().invoke(app, ["runs", "sync", str(buf)])
    # finished: the rest replayed, the lost artifact's call named and kept aside (exit 2)
    assert isinstance(result.exception, DataError), result.output
    said = " ".join(result.output.split())
    assert "not sent, its file is missing" in said and "a.txt no longer exists" in said
    assert "0 buffer files left" in said and not list(buf.glob("*.jsonl"))
    assert len(list(buf.glob("*.jsonl.unsent"))) == 1


def test_a_benchmark_script_given_a_wrong_path_says_so_without_a_traceback(
    tmp_path: Path,
) -> None:
    """bench_tokenize, bench_collate, self_train and others printed a DataError traceback;
    every script's entry is now `run_script(main)`: error, hint, the error's exit code."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_collate", "--data", str(tmp_path / "nope")],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "error:" in done.stderr and "nope" in done.stderr and "Traceback" not in done.stderr
    scripts = sorted((root / "benchmarks").glob("*.py"))
    mains = [p for p in scripts if 'if __name__ == "__main__":' in p.read_text("utf-8")]
    assert mains and all("run_script(main)" in p.read_text("utf-8") for p in mains)
