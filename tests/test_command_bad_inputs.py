"""Bad input to `corpus prepare`, `vocab build`, `export hf`, `model memory` and `finetune
report`, as a new user gives it: a clear error naming the file or flag, no traceback, and
output that reads as written (paths with brackets, files others can read)."""

from __future__ import annotations

import json
import re
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest
from tibetan_fixtures import prepared_inputs, write_prepared
from typer.testing import CliRunner

from tibnlp.cli.main import app
from tibnlp.config import CorpusConfig, VocabConfig
from tibnlp.errors import DataError
from tibnlp.evaluation.result_loader import load_results
from tibnlp.text.prepare import prepare_corpus

S = "བཀྲ་ཤིས་བདེ་ལེགས། ཁྱེད་རང་སྐུ་གཟུགས་བདེ་པོ་ཡིན་པས།"


def _cfg(**kw: object) -> CorpusConfig:
    return CorpusConfig(num_proc=1, heldout_fraction=0.0, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny exportable ALBERT pretraining directory with its vocabulary."""
    import torch

    from tibnlp.config.model import HeadsConfig, ModelConfig
    from tibnlp.models.io import save_pretrained
    from tibnlp.models.pretraining import AlbertForPretraining
    from tibnlp.text.vocab import Vocabulary

    root = prepared_inputs(tmp_path_factory.mktemp("qa_model"), n_docs=60, heldout=10)
    vocab = Vocabulary.load(root / "vocab")
    cfg = ModelConfig(
        vocab_size=vocab.size, embedding_size=16, hidden_size=32, num_layers=1, ffn_size=64,
        max_len=32, heads=HeadsConfig(small=2, large=2),
    )  # fmt: skip
    torch.manual_seed(0)
    out = save_pretrained(AlbertForPretraining(cfg).eval(), cfg, root / "model")
    for item in (root / "vocab").iterdir():
        shutil.copy2(item, out / item.name)
    return out


def test_corpus_prepare_help_names_the_config_keys() -> None:
    """`[corpus.field]` in the help was read as rich markup and vanished: "the text ."."""
    result = CliRunner().invoke(app, ["corpus", "prepare", "--help"], env={"COLUMNS": "200"})
    for key in ("corpus.field", "corpus.on_error", "corpus.num_proc"):
        assert key in result.output, result.output


def _commands(cmd: Any, ctx: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    if not hasattr(cmd, "list_commands"):
        return [(path, cmd)]
    return [
        leaf
        for name in cmd.list_commands(ctx)
        for leaf in _commands(cmd.get_command(ctx, name), ctx, (*path, name))
    ]


def test_every_command_lists_as_one_line() -> None:
    """A group's command list prints the docstring's first paragraph with its line breaks
    kept: `data list` showed a five-line entry, broken mid-sentence ("exits / 1 when ...")."""
    import click
    import typer

    root = typer.main.get_command(app)
    commands = dict(_commands(root, click.Context(root)))
    assert ("data", "list") in commands and ("pretrain",) in commands, list(commands)
    for path, cmd in commands.items():
        first = (cmd.help or "").strip().split("\n\n")[0]
        assert first and "\n" not in first, (path, first)
    shown = CliRunner().invoke(app, ["data", "--help"], env={"COLUMNS": "200"}).output
    assert "matching checksums." in shown and "damaged" not in shown, shown


def test_no_option_help_loses_a_bracketed_text_to_rich_markup() -> None:
    """`--set`'s help showed "stages.finetune.grid.finetune.head= a pipeline grid's": rich
    read `[cnn]` as a markup tag. Every option's help is shown with its brackets."""
    import click
    import typer

    root = typer.main.get_command(app)
    checked = 0
    for path, cmd in _commands(root, click.Context(root)):
        wanted = [
            text.replace("\\[", "[")
            for param in cmd.params
            for text in re.findall(r"\\?\[[^\]\s]+\]", getattr(param, "help", None) or "")
        ]
        if not wanted:
            continue
        shown = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "2000"}).output
        flat = " ".join(shown.replace("│", " ").split())
        for text in wanted:
            assert text in flat, (path, text)
            checked += 1
    assert checked, "no option help holds a bracketed text: the test checks nothing"


@pytest.mark.parametrize("indent", [None, 1])
def test_a_json_array_file_is_named_as_one(tmp_path: Path, indent: int | None) -> None:
    """A `.json` holding one array was reported as a JSON syntax error on line 1 or as "no
    string field 'text'", with advice to pass --field."""
    path = tmp_path / "records.json"
    path.write_text(json.dumps([{"text": S}], ensure_ascii=False, indent=indent), "utf-8")
    with pytest.raises(DataError, match=r"records\.json:1: ") as err:
        prepare_corpus([path], tmp_path / "out", _cfg(), progress=False)
    assert "one JSON array" in str(err.value.hint), err.value.hint
    assert not (tmp_path / "out").exists()


def test_every_line_skipped_is_not_called_empty_files(tmp_path: Path) -> None:
    """With --on-error skip, a file whose every record was skipped was "all files empty?"."""
    path = tmp_path / "x.jsonl"
    path.write_text('{"body": "ཀ"}\n{oops\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"every line was skipped.*invalid_json: 1") as err:
        prepare_corpus([path], tmp_path / "out", _cfg(on_error="skip"), progress=False)
    assert "missing_field: 1" in str(err.value)
    assert not (tmp_path / "out").exists()


def test_paths_with_brackets_are_printed_as_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Paths were printed as rich markup: `[old]/c` came out as `/c`."""
    monkeypatch.chdir(tmp_path)
    Path("a.txt").write_text(f"{S}\n\n{S} {S}\n", encoding="utf-8")
    args = ["corpus", "prepare", "-i", "a.txt", "-o", "[old]/c", "--no-progress"]
    result = CliRunner().invoke(app, [*args, "-s", "corpus.num_proc=1"])
    assert result.exit_code == 0, result.output
    assert "written to [old]/c" in result.output, result.output
    write_prepared(Path("corpus"), n_docs=40, heldout=5)
    args = ["vocab", "build", "--corpus", "corpus", "--output", "[v]", "--vocab-size", "100"]
    result = CliRunner().invoke(app, [*args, "-s", "vocab.num_threads=1"])
    assert result.exit_code == 0, result.output
    assert "vocabulary [v]" in result.output, result.output


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_vocab_build_fails_on_its_output_before_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The output folder was made only after training: minutes lost to learn it cannot be."""
    import tibnlp.text.vocab_build as vb

    corpus = write_prepared(tmp_path / "corpus", n_docs=20, heldout=2)
    trained: list[int] = []
    monkeypatch.setattr(vb, "_train", lambda *a, **k: trained.append(1))
    with pytest.raises(DataError, match="cannot write"):  # no folder can be made under /proc
        vb.build_vocabulary(corpus, Path("/proc/tibnlp-no-such/vocab"), VocabConfig())
    assert not trained


def test_exported_weights_are_readable_like_the_other_files(
    model_dir: Path, tmp_path: Path
) -> None:
    """safetensors' save_file made model.safetensors private (0600) beside 0644 files."""
    pytest.importorskip("tokenizers")
    out = tmp_path / "hf"
    result = CliRunner().invoke(
        app, ["export", "hf", "--model", str(model_dir), "--output", str(out)]
    )
    assert result.exit_code == 0, result.output

    def mode(name: str) -> int:
        return stat.S_IMODE((out / name).stat().st_mode)

    assert mode("model.safetensors") == mode("config.json")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--budget", "0"], "--budget"),
        (["--threshold", "-1"], "--threshold"),
        (["--segment-len", "1"], "--segment-len"),
        (["--segment-len", "33"], "max_len 32"),
    ],
)
def test_model_memory_refuses_values_that_select_nothing_or_crash(
    model_dir: Path, tmp_path: Path, extra: list[str], message: str
) -> None:
    """--budget 0 and --threshold -1 kept nothing and exited 0; --segment-len 1 or above
    max_len ended in a ValueError traceback from the encoder."""
    text = tmp_path / "doc.txt"
    text.write_text(S + "\n", encoding="utf-8")
    args = ["model", "memory", "--model", str(model_dir), "--text", str(text), *extra]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 2, (result.output, result.exception)
    assert message in result.output, result.output


def test_model_memory_refuses_a_folder_as_text(model_dir: Path, tmp_path: Path) -> None:
    """A folder given to --text ended in an IsADirectoryError traceback."""
    args = ["model", "memory", "--model", str(model_dir), "--text", str(tmp_path)]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 2, (result.output, result.exception)
    # typer's error box may wrap the message whatever COLUMNS says: read it unboxed
    flat = " ".join(re.sub("[│╭╮╰╯─]", " ", result.output).split())
    assert "is a directory" in flat, result.output


def _result(**changes: object) -> dict:
    row = {
        "system": "s",
        "dataset": "d",
        "seeds": [],
        "aggregate": {"test": {"macro_f1": {"mean": 0.5, "std": 0.01}}},
    }
    return {**row, **changes}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\xff\xfe{}", r"not valid JSON \(not UTF-8\)"),
        (json.dumps(_result(dataset=None)).encode(), r"key 'dataset' is missing"),
        (json.dumps(_result(aggregate="x")).encode(), r"key 'aggregate' is not an object"),
        (
            json.dumps(_result(aggregate={"test": {"macro_f1": [0.5]}})).encode(),
            r"aggregate\.test\.macro_f1 is not a mean and std",
        ),
        (
            json.dumps(_result(aggregate={"test": {"macro_f1": {"mean": "x", "std": 0}}})).encode(),
            r"aggregate\.test\.macro_f1 is not a mean and std",
        ),
    ],
)
def test_a_damaged_results_file_is_named(tmp_path: Path, content: bytes, message: str) -> None:
    """Each ended in a UnicodeDecodeError, KeyError, ValueError or TypeError traceback (or, for
    a string aggregate, a table with no scores and exit 0)."""
    path = tmp_path / "results.json"
    path.write_bytes(content)
    result = CliRunner().invoke(app, ["finetune", "report", str(path)])
    assert isinstance(result.exception, DataError), result.exception
    assert str(path) in str(result.exception)
    with pytest.raises(DataError, match=message):
        load_results([path])


def test_a_result_named_twice_is_one_row(tmp_path: Path) -> None:
    """A results.json given itself and through its folder was two rows (and `--select` said
    "best of 2")."""
    path = tmp_path / "run" / "results.json"
    path.parent.mkdir()
    path.write_text(json.dumps(_result()), encoding="utf-8")
    assert len(load_results([path, tmp_path, path])) == 1


def test_an_input_that_is_no_regular_file_is_not_called_missing(tmp_path: Path) -> None:
    """`--input /dev/null` and a broken link were both "does not exist"."""
    (tmp_path / "link.txt").symlink_to(tmp_path / "nowhere.txt")
    for path, message in (
        (Path("/dev/null"), "is not a regular file"),
        (tmp_path / "link.txt", "is a broken link"),
    ):
        if not (path.exists() or path.is_symlink()):
            continue
        with pytest.raises(DataError, match=message):
            prepare_corpus([path], tmp_path / "out", _cfg(), progress=False)


def test_a_vocabulary_size_below_the_characters_says_raise_it(tmp_path: Path) -> None:
    """A size below the corpus's characters was told "supports at most fewer pieces" and
    "lower --vocab-size": the opposite of the fix."""
    from tibnlp.text.vocab_build import build_vocabulary

    corpus = write_prepared(tmp_path / "corpus", n_docs=20, heldout=2)
    with pytest.raises(DataError, match=r"vocabulary size 16 is below the \d+ characters") as err:
        build_vocabulary(corpus, tmp_path / "v", VocabConfig(vocab_size=16, num_threads=1))
    assert "raise --vocab-size to at least" in str(err.value.hint)
    assert not (tmp_path / "v").exists()


def test_an_error_naming_a_path_with_brackets_prints_it_whole(tmp_path, monkeypatch, capsys):
    """The CLI's error line is text, not rich markup: `[old]` in a path must survive."""
    from tibnlp.cli import main as cli_main

    missing = tmp_path / "[old]" / "a.txt"
    argv = ["tibnlp", "corpus", "prepare", "-i", str(missing), "-o", str(tmp_path / "out")]
    monkeypatch.setattr("sys.argv", argv)
    with pytest.raises(SystemExit) as exit_:
        cli_main.main()
    assert exit_.value.code != 0
    err = "".join(capsys.readouterr().err.split())  # rich wraps long lines
    assert f"input{missing}doesnotexist" in err.replace(" ", "")
    assert not (tmp_path / "out").exists()


def test_an_empty_model_yaml_is_named_not_read_as_defaults(model_dir: Path, tmp_path: Path):
    from tibnlp.models.io import load_config_file

    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    (broken / "model.yaml").write_text("", encoding="utf-8")
    with pytest.raises(DataError, match=r"model.yaml holds no model settings \(empty\)"):
        load_config_file(broken)


def test_a_missing_corpus_is_called_missing(tmp_path: Path) -> None:
    from tibnlp.text.prepared import load_prepared

    with pytest.raises(DataError, match=r"corpus .*nowhere does not exist"):
        load_prepared(tmp_path / "nowhere")


def test_a_classifier_folder_given_as_model_names_what_it_is(tmp_path: Path) -> None:
    """`finetune --model SEED_FOLDER` said only "not a saved model directory"."""
    from tibnlp.models.io import load_config_file

    seed = tmp_path / "seed-1"
    seed.mkdir()
    (seed / "classifier.yaml").write_text("source_model: runs/x/model\n", encoding="utf-8")
    with pytest.raises(DataError) as err:
        load_config_file(seed)
    assert "fine-tuned classifier" in str(err.value.hint)
    assert "fine-tuned from runs/x/model" in str(err.value.hint)
