"""Config files, `--set` values and pipeline files a user gets wrong (or right in YAML's other
spelling): each is read as meant or refused at load, naming the file and key, never a
traceback or a value that fails later inside the run."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tibnlp.cli.main import main
from tibnlp.config import load_config
from tibnlp.errors import ConfigError
from tibnlp.pipeline.context import Accepts, StageContext
from tibnlp.pipeline.registry import register_stage
from tibnlp.pipeline.spec import load_pipeline


def _noop(ctx: StageContext) -> dict[str, Any]:
    return {}


register_stage("qa_files", _noop, (), accepts=Accepts(files=True))


def _refused(overrides: list[str], path: Path | None = None) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(path, overrides)
    return err.value.message


def test_yaml_1_1_words_are_text_except_where_a_key_is_bool(tmp_path: Path) -> None:
    """`engine.compile: off` (a documented value) was YAML 1.1's False and refused; a tag
    `country: NO` was False too. Bool keys still take yes/no/on/off."""
    path = tmp_path / "c.yaml"
    path.write_text(
        "engine: {compile: off}\nfinetune: {freeze_encoder: yes}\ntracking: {tags: {c: NO}}\n"
    )
    cfg = load_config(path)
    assert (cfg.engine.compile, cfg.finetune.freeze_encoder) == ("off", True)
    assert cfg.tracking.tags == {"c": "NO"}
    cfg = load_config(None, ["engine.compile=off", "finetune.freeze_encoder=on"])
    assert (cfg.engine.compile, cfg.finetune.freeze_encoder) == ("off", True)
    assert "finetune.freeze_encoder" in _refused(["finetune.freeze_encoder=maybe"])


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("pretrain.optimizer.lr=.inf", "pretrain.optimizer.lr"),
        ("finetune.optimizer.grad_clip=.nan", "finetune.optimizer.grad_clip"),
        ("pretrain.max_tokens=1e400", "pretrain.max_tokens"),
        ("pretrain.export_at_tokens=[.inf]", "pretrain.export_at_tokens[0]"),
        ("pretrain.time_budget=inf", "pretrain.time_budget"),
    ],
)
def test_non_finite_numbers_are_refused(override: str, key: str) -> None:
    """nan passes every range check (comparisons are false) and inf most: an infinite lr or
    token limit ran."""
    assert f"'{key}'" in _refused([override])


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("corpus.seed=-1", "corpus.seed"),
        ("vocab.seed=-5", "vocab.seed"),
        ("pretrain.seed=4294967296", "pretrain.seed"),
        ("finetune.seeds=[1, -1]", "finetune.seeds[1]"),
        ("finetune.optimizer.grad_clip=-1", "finetune.optimizer.grad_clip"),
        ("model.layer_norm_eps=0", "model.layer_norm_eps"),
        ("model.initializer_range=-0.02", "model.initializer_range"),
    ],
)
def test_values_that_fail_inside_the_run_are_refused_at_load(override: str, key: str) -> None:
    """numpy refuses seeds outside [0, 2**32) only once the data is read."""
    assert f"'{key}'" in _refused([override])


def test_a_string_key_takes_the_text_as_typed() -> None:
    """`--set tracking.run_name=run #3` was "run" (a YAML comment), `x: y` a mapping and
    `@x` invalid YAML; quotes still quote, null is still no string."""
    cfg = load_config(
        None,
        ["tracking.run_name=run #3", "tracking.experiment=a: b", "finetune.model=@x"],
    )
    assert (cfg.tracking.run_name, cfg.tracking.experiment) == ("run #3", "a: b")
    assert cfg.finetune.model == "@x"
    assert load_config(None, ["tracking.run_name='a b'"]).tracking.run_name == "a b"
    assert "tracking.run_name" in _refused(["tracking.run_name=null"])
    assert "not valid YAML" in _refused(["finetune.seeds=[1,"])


def test_a_section_given_to_set_keeps_the_files_other_keys(tmp_path: Path) -> None:
    """`--set model={num_layers: 2}` replaced the file's whole model section: the file's
    hidden_size 128 and 4 heads silently became the defaults 384 and 12."""
    path = tmp_path / "c.yaml"
    path.write_text("model: {hidden_size: 128, heads: {small: 4, large: 4}}\n")
    cfg = load_config(path, ["model={num_layers: 2}", "model.heads={small: 2}"])
    assert (cfg.model.hidden_size, cfg.model.num_layers) == (128, 2)
    assert (cfg.model.heads.small, cfg.model.heads.large) == (2, 4)
    assert load_config(path, ["model=null"]).model.hidden_size == 384


def test_a_config_from_a_pipe_is_read() -> None:
    """`-c <(...)` names /dev/fd/N, which exists but is no regular file: it was 'does not
    exist'."""
    read, write = os.pipe()
    os.write(write, b"model: {num_layers: 2}\n")
    os.close(write)
    try:
        assert load_config(Path(f"/dev/fd/{read}")).model.num_layers == 2
    finally:
        os.close(read)


def test_keys_of_mixed_types_name_the_key(tmp_path: Path) -> None:
    """`1:` beside `a:` made sorting the unknown keys a TypeError."""
    path = tmp_path / "c.yaml"
    path.write_text("model: {1: 2, hidden: 3}\n")
    assert "'model.1' is unknown" in _refused([], path)


def _pipeline(tmp_path: Path, text: str) -> Path:
    (tmp_path / "in.txt").write_text("x")
    path = tmp_path / "p.yaml"
    path.write_text(
        f"workdir: {tmp_path / 'work'}\nconfig: {{tracking: {{enabled: false}}}}\n" + text
    )
    return path


A = "  a: {kind: qa_files, inputs: [in.txt]}\n"
B = "  b: {kind: qa_files, inputs: ['${stages.a.output}']"


def test_a_stage_output_in_the_shared_config_exits_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The shared `config:` reaches every stage: `${stages.a.output}` there was a KeyError
    traceback at plan."""
    monkeypatch.chdir(tmp_path)
    path = _pipeline(tmp_path, "stages:\n" + A + B + "}\n")
    text = path.read_text().replace(
        "{enabled: false}}", "{enabled: false, run_name: '${stages.a.output}'}}"
    )
    path.write_text(text)
    monkeypatch.setattr(sys, "argv", ["tibnlp", "pipeline", "run", "--dry-run", str(path)])
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err
    assert exit_.value.code not in (0, None)
    assert str(path) in err.replace("\n", "") and "config.tracking" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("stage", "where"),
    [
        ("grid: {1: [1, 2]}", "stages.b.grid: 1 is not a dotted key"),
        ("grid: {null: [1]}", "stages.b.grid: None is not a dotted key"),
        ("variants: [{name: x, set: {2: 1}}]", "stages.b.variants[0].set: 2 is not"),
        ("launch: [torchrun]", "stages.b.launch: expected a single value"),
    ],
)
def test_grid_and_variant_keys_that_are_no_dotted_key_are_named(
    tmp_path: Path, stage: str, where: str
) -> None:
    path = _pipeline(tmp_path, "stages:\n" + A + B + ", " + stage + "}\n")
    with pytest.raises(ConfigError) as err:
        load_pipeline(path)
    assert where in err.value.message and str(path) in err.value.message


@pytest.mark.parametrize(
    ("stage", "where"),
    [
        ("launch: torchrun --nproc_per_node 2", "must end with the launcher's module flag"),
        ('launch: "torchrun \'-m"', "cannot be split into words"),
    ],
)
def test_a_launch_that_cannot_run_the_stage_is_refused_at_load(
    tmp_path: Path, stage: str, where: str
) -> None:
    # before: accepted, and the stage failed under torchrun ("can't open file
    # 'tibnlp.cli.main'") or with a ValueError traceback, after the stages above it had run
    path = _pipeline(tmp_path, "stages:\n" + A + B + ", " + stage + "}\n")
    with pytest.raises(ConfigError) as err:
        load_pipeline(path)
    assert "stages.b.launch" in err.value.message and where in err.value.message
    ok = _pipeline(tmp_path, "stages:\n" + A + B + ", launch: torchrun --nproc_per_node 2 -m}\n")
    assert load_pipeline(ok).stages[1].launch == "torchrun --nproc_per_node 2 -m"


def test_top_level_values_of_the_wrong_shape(tmp_path: Path) -> None:
    """`workdir: 5` was a TypeError from Path(5); `name: [a]` named the pipeline "['a']"."""
    path = _pipeline(tmp_path, "stages:\n" + A)
    path.write_text(path.read_text().replace(f"workdir: {tmp_path / 'work'}", "workdir: 5"))
    assert load_pipeline(path).workdir == Path("5")
    path.write_text(path.read_text().replace("workdir: 5", "name: [a]"))
    with pytest.raises(ConfigError, match="'name' must be a single value"):
        load_pipeline(path)


def test_a_variable_may_read_another_but_not_itself(tmp_path: Path) -> None:
    """`${vars.base}` inside another variable was 'unknown reference ${vars.base}'."""
    stages = "stages:\n" + A + "  b: {kind: qa_files, inputs: ['${vars.out}']}\n"
    path = _pipeline(tmp_path, "vars: {base: in, out: '${vars.base}.txt'}\n" + stages)
    spec = load_pipeline(path)
    assert spec.stages[1].inputs == ["in.txt"] and spec.vars["out"] == "in.txt"
    path = _pipeline(tmp_path, "vars: {x: '${vars.y}', y: '${vars.x}'}\n" + stages)
    with pytest.raises(ConfigError, match=r"read each other \(y -> x -> y\)"):
        load_pipeline(path)


def test_collect_still_takes_yes(tmp_path: Path) -> None:
    """YAML 1.2 reads `collect: yes` as text; a bool key of the pipeline file takes it."""
    spec = load_pipeline(_pipeline(tmp_path, "stages:\n" + A + B + ", collect: yes}\n"))
    assert spec.stages[1].collect is True


@pytest.mark.parametrize("name", ["../x", "a/b", "..", "a\\b"])
def test_a_pipeline_name_is_a_plain_name(tmp_path: Path, name: str) -> None:
    """The default workdir is runs/pipelines/<name>: '../x' put it outside that folder."""
    path = _pipeline(tmp_path, "stages:\n" + A)
    path.write_text(f"name: '{name}'\n" + path.read_text())
    with pytest.raises(ConfigError, match="is not a plain name"):
        load_pipeline(path)


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("model.vocab_size=0", "model.vocab_size': must be >= 1"),
        ("vocab.max_sentence_length=0", "vocab.max_sentence_length': 0 is outside"),
        ("vocab.special_tokens=['[PAD]','[UNK]','[CLS]','[SEP]','[MASK]','[PAD]']", "distinct"),
        ("vocab.special_tokens=['[PAD]','[UNK]','[CLS]','[SEP]','[MASK]','']", "non-empty"),
        (
            "vocab.special_tokens=['[PAD]','[UNK]','[CLS]','[SEP]','[MASK]','\u2581']",
            "'\u2581': an",
        ),
        (
            "vocab.special_tokens=['[PAD]','[UNK]','[CLS]','[SEP]','[MASK]','\u0f40']",
            "'\u0f40': an",
        ),
        ("vocab.special_tokens=['[PAD]','[UNK]','[CLS]','[SEP]','[MASK]','a b']", "'a b': an"),
        ("pretrain.output=' '", "pretrain.output': must name a folder"),
        ("finetune.output=''", "finetune.output': must name a folder"),
    ],
)
def test_values_that_fail_later_are_refused_at_load(override: str, says: str) -> None:
    assert says in _refused([override])


def test_the_document_task_is_tnccs_alone() -> None:
    """finetune.task chooses between TNCC's titles and documents and nothing elsewhere:
    `classify --dataset wcm_bo --set finetune.task=document` read the set as it is, while the
    run logged the document task. Refused at load, so a pipeline's dry run refuses it too."""
    said = _refused(["finetune.dataset=wcm_bo", "finetune.task=document"])
    assert "finetune.task': 'document' is a task of TNCC" in said
    assert "dataset 'wcm_bo' has one task only" in said
    for dataset in ("tncc", "tncc_document"):  # (tncc_document: the document task by name)
        load_config(None, [f"finetune.dataset={dataset}", "finetune.task=document"])
    load_config(None, ["finetune.dataset=wcm_bo", "finetune.task=title"])


def test_finetune_tncc_reads_tncc_whatever_the_config_file_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`finetune tncc` read TNCC but kept a config file's other dataset in its config (and
    logged it); with the task check, `--task document` was then refused."""
    from tibnlp.cli import finetune as cli

    seen: list[Any] = []
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("finetune: {dataset: tusa}\n", "utf-8")
    monkeypatch.setattr(
        cli,
        "_run",
        lambda cfg, dataset, task, wait: seen.append((cfg.finetune.dataset, dataset, task)),
    )
    cli.tncc(task="document", config=cfg_file)
    assert seen == [("tncc", "tncc", "document")]


def test_finetune_tncc_refuses_another_dataset_from_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """A --set comes after the command's flags: `finetune tncc --set finetune.dataset=tusa`
    read TNCC but logged and fingerprinted tusa."""
    from tibnlp.cli import finetune as cli

    monkeypatch.setattr(cli, "_run", lambda *args: pytest.fail("ran"))
    with pytest.raises(ConfigError, match="`finetune tncc` reads TNCC, not 'tusa'") as err:
        cli.tncc(set_=["finetune.dataset=tusa"])
    assert "finetune classify --dataset tusa" in str(err.value.hint)
