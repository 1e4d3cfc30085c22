"""Mistakes in a pipeline file or its --set/--workdir options are refused when it loads (so
by a --dry-run too), naming the file, the stage and the key, before any stage runs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tibnlp.errors import ConfigError
from tibnlp.pipeline.context import Accepts, StageContext
from tibnlp.pipeline.planner import Planner
from tibnlp.pipeline.registry import known_kinds, register_stage, stage_def
from tibnlp.pipeline.runner import run_pipeline
from tibnlp.pipeline.spec import load_pipeline


def _noop(ctx: StageContext) -> dict[str, Any]:
    return {}


register_stage("v_pair", _noop, (), accepts=Accepts(needs=("left",), may=("right",)))


def _write(tmp_path: Path, stages: dict[str, Any], **top: Any) -> Path:
    path = tmp_path / "p.yaml"
    body = {
        "name": "p",
        "workdir": str(tmp_path / "work"),
        "config": {"tracking": {"enabled": False}},
        **top,
        "stages": stages,
    }
    path.write_text(yaml.safe_dump(body, sort_keys=False), encoding="utf-8")
    return path


def _refused(path: Path, *sets: str) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        load_pipeline(path, sets)
    return err.value


CHAIN = {
    "prepare": {"inputs": ["data:corpora/toy.txt"]},
    "vocab": {"inputs": {"corpus": "${stages.prepare.output}"}},
}


def test_set_of_an_unknown_variable_is_refused(tmp_path: Path) -> None:
    """`--set vars.tokenz=5` (a typo) added an unused variable and ran with the old value."""
    path = _write(tmp_path, CHAIN, vars={"tokens": 1, "budget": "1m"})
    err = _refused(path, "vars.tokenz=5")
    assert f"{path}: --set vars.tokenz" in err.message and "'tokenz'" in err.message
    assert "tokens, budget" in str(err.hint)
    assert load_pipeline(path, ["vars.tokens=5"]).vars["tokens"] == 5
    assert "no variables" in str(_refused(_write(tmp_path, CHAIN), "vars.x=1").hint)


def test_set_of_an_unknown_stage_names_the_stages(tmp_path: Path) -> None:
    """`--set stages.nope.config...` made a stage `nope`, reported as an unknown stage kind."""
    err = _refused(_write(tmp_path, CHAIN), "stages.nope.config.vocab.vocab_size=5")
    assert "no stage named 'nope'" in err.message and "kind" not in err.message
    assert "prepare, vocab" in str(err.hint)


@pytest.mark.parametrize("text", ["nope", "=3", " =3"])
def test_a_set_without_key_or_value_quotes_what_was_typed(tmp_path: Path, text: str) -> None:
    """`--set nope` was refused as "override 'config.nope' must look like ...": a key the
    user never typed."""
    err = _refused(_write(tmp_path, CHAIN), text)
    assert f"--set {text!r} must look like section.key=value" in err.message
    assert "config." not in err.message


@pytest.mark.parametrize(
    ("stage", "where"),
    [
        ({"params": {"foo": 1}}, "stages.vocab.params.foo"),
        ({"grid": {"params.foo": [1, 2]}}, "stages.vocab: variant foo=1 sets params.foo"),
    ],
)
def test_an_unknown_param_is_refused_at_load(tmp_path: Path, stage: dict, where: str) -> None:
    """A param no stage kind reads was ignored, in a real run too."""
    path = _write(tmp_path, {**CHAIN, "vocab": {**CHAIN["vocab"], **stage}})
    err = _refused(path)
    assert f"{path}: {where}" in err.message and "takes no param 'foo'" in err.message
    assert "vocab takes no params" in str(err.hint)
    sliced = {"slice": {"inputs": ["data:corpora/toy.txt"], "params": {"max_doc": 3}}}
    err = _refused(_write(tmp_path, sliced))
    assert "stages.slice.params.max_doc" in err.message and "max_docs, max_chars" in str(err.hint)
    sliced["slice"]["params"] = {"max_docs": 3}
    assert load_pipeline(_write(tmp_path, sliced)).stages[0].params == {"max_docs": 3}


@pytest.mark.parametrize(
    ("inputs", "said"),
    [
        ({"korpus": "${stages.prepare.output}"}, r"stages\.vocab\.inputs\.korpus: .*'korpus'"),
        (None, r"stages\.vocab\.inputs: stage kind vocab needs an input named 'corpus'"),
        (["${stages.prepare.output}"], r"stages\.vocab\.inputs: .*named inputs, not a list"),
    ],
)
def test_a_wrong_or_missing_input_name_fails_the_dry_run(
    tmp_path: Path, inputs: Any, said: str
) -> None:
    """`korpus:` for `corpus:` planned as "run"; the real run failed after the stages above
    it ran, left a partial folder and did not name the file."""
    path = _write(tmp_path, {**CHAIN, "vocab": {"inputs": inputs}})
    err = _refused(path)
    assert err.message.startswith(f"{path}: ")
    assert re.search(said, err.message), err.message
    assert "stage kind vocab reads: corpus" in str(err.hint)
    assert not (tmp_path / "work").exists()


def test_inputs_of_every_kind_follow_its_declaration(tmp_path: Path) -> None:
    """pretrain needs corpus and vocab and may have init; prepare needs files; a kind
    registered with `accepts=` is checked the same way."""
    ok = {"corpus": "a", "vocab": "b", "init": "c"}
    assert load_pipeline(_write(tmp_path, {"pretrain": {"inputs": ok}}))
    err = _refused(_write(tmp_path, {"pretrain": {"inputs": {"corpus": "a", "init": "c"}}}))
    assert "needs an input named 'vocab'" in err.message
    assert "corpus, vocab, init (optional)" in str(err.hint)
    err = _refused(_write(tmp_path, {"prepare": {"inputs": []}}))
    assert "stages.prepare.inputs: stage kind prepare needs at least one input" in err.message
    err = _refused(_write(tmp_path, {"p": {"kind": "v_pair", "inputs": {"rigth": "a"}}}))
    assert "stages.p.inputs.rigth: stage kind v_pair reads no input named 'rigth'" in err.message
    assert load_pipeline(_write(tmp_path, {"p": {"kind": "v_pair", "inputs": {"left": "a"}}}))


def test_every_builtin_kind_declares_what_its_fills_read() -> None:
    """The inputs a kind sets config paths from (`fills`) are inputs it declares."""
    for kind in known_kinds():
        sdef = stage_def(kind)
        if sdef.accepts is None:
            continue
        declared = {*sdef.accepts.needs, *sdef.accepts.may}
        assert {src for _, src in sdef.fills if src} <= declared, kind


def test_an_unknown_kind_from_the_stage_name_says_so(tmp_path: Path) -> None:
    err = _refused(_write(tmp_path, {"plot": {"inputs": ["a"]}}))
    assert "stages.plot: unknown stage kind 'plot'" in err.message
    assert "kind is its name" in err.message


@pytest.mark.parametrize("dry_run", [True, False])
@pytest.mark.parametrize("under", [False, True])
def test_a_work_dir_that_is_a_file_is_refused(tmp_path: Path, dry_run: bool, under: bool) -> None:
    """`--workdir afile` passed a --dry-run and crashed the run with a FileExistsError."""
    path = _write(tmp_path, {"p": {"kind": "v_pair", "inputs": {"left": str(tmp_path)}}})
    afile = tmp_path / "afile"
    afile.write_text("keep", encoding="utf-8")
    workdir = afile / "sub" if under else afile
    with pytest.raises(ConfigError, match=r"--workdir: .*afile.* a file, not a folder"):
        run_pipeline(load_pipeline(path), dry_run=dry_run, workdir=workdir, echo=lambda _: None)
    assert afile.read_text(encoding="utf-8") == "keep"
    with pytest.raises(ConfigError, match=r"p\.yaml: workdir: .*afile is a file"):
        run_pipeline(load_pipeline(path, [f"workdir={afile}"]), dry_run=dry_run, echo=print)


@pytest.mark.parametrize(
    ("config", "stage_config", "sets", "said"),
    [
        # the shared section is merged into every stage: the first stage checked is not the place
        ({"pretrain": {"mask_probb": 0.3}}, {}, [], r": config\.pretrain\.mask_probb: config key"),
        ({}, {}, ["pretrain.batch_size=abc"], r": --set pretrain\.batch_size: config key"),
        (
            {"pretrain": {"max_tokens": "${vars.tokens}"}},
            {},
            ["vars.tokens=abc"],
            r": config\.pretrain\.max_tokens = \$\{vars\.tokens\} \(--set vars\.tokens\): ",
        ),
        ({}, {"pretrain": {"seed": "x"}}, [], r": stages\.b\.config\.pretrain\.seed: config key"),
    ],
)
def test_a_bad_config_value_is_named_where_it_was_set(
    tmp_path: Path, config: dict, stage_config: dict, sets: list[str], said: str
) -> None:
    """Each stage validates the shared section merged with its own, so an error in the shared
    section or a `--set` was reported against the first stage (`stages.a: ...`)."""
    left = tmp_path / "left.txt"
    left.write_text("x", encoding="utf-8")
    stages = {
        "a": {"kind": "v_pair", "inputs": {"left": str(left)}},
        "b": {"kind": "v_pair", "inputs": {"left": str(left)}, "config": stage_config},
    }
    path = _write(
        tmp_path,
        stages,
        vars={"tokens": 5},
        config={"tracking": {"enabled": False}, **config},
    )
    with pytest.raises(ConfigError) as err:
        run_pipeline(load_pipeline(path, sets), dry_run=True, echo=lambda _: None)
    assert err.value.message.startswith(f"{path}: "), err.value.message
    assert re.search(said, err.value.message), err.value.message
    assert "stages.a:" not in err.value.message


def test_a_param_value_that_is_no_number_fails_the_dry_run(tmp_path: Path) -> None:
    """`--set vars.docs=abc` planned as "run"; the slice stage then died on int('abc') with a
    ValueError traceback, a partial folder left. The same for a grid's `export_tokens`."""
    text = tmp_path / "toy.txt"
    text.write_text("ཀ་ཁ།\n\nག་ང།\n\nཅ་ཆ།\n", encoding="utf-8")
    stages = {"slice": {"inputs": [str(text)], "params": {"max_docs": "${vars.docs}"}}}
    path = _write(tmp_path, stages, vars={"docs": 2})
    for value, said in (("abc", "'abc' is not a whole number >= 1"), ("0", "0 is not a whole")):
        with pytest.raises(ConfigError) as err:
            run_pipeline(load_pipeline(path, [f"vars.docs={value}"]), dry_run=True, echo=print)
        assert f"{path}: stages.slice: params.max_docs: {said}" in err.value.message
    assert not (tmp_path / "work").exists()
    result = run_pipeline(load_pipeline(path, ["vars.docs=2.0"]), echo=lambda _: None)
    sliced = result.outputs["slice"].read_text(encoding="utf-8")
    assert sliced == "ཀ་ཁ།\n\nག་ང།\n\n"
    model = tmp_path / "model"
    model.mkdir()
    tuned = {
        "finetune": {"inputs": {"model": str(model)}, "grid": {"params.export_tokens": [1e6, "2M"]}}
    }
    with pytest.raises(ConfigError, match=r"stages.finetune\[export_tokens=2M\]: params.export_"):
        run_pipeline(load_pipeline(_write(tmp_path, tuned)), dry_run=True, echo=lambda _: None)


@pytest.mark.parametrize("name", ["..", ".", "", ".hidden", "a/b", "a\\b", "../up"])
def test_a_stage_name_that_is_no_plain_name_is_refused(tmp_path: Path, name: str) -> None:
    """A stage's outputs go to <workdir>/<stage>: a stage named '..' wrote beside the work dir,
    and `pipeline clean` listed (and with --yes removed) folders there."""
    err = _refused(_write(tmp_path, {name: {"kind": "v_pair", "inputs": {"left": "x"}}}))
    assert f"stage name {name!r} is not a plain name" in err.message
    ok = {"a.b": {"kind": "prepare", "inputs": ["x"]}}
    assert load_pipeline(_write(tmp_path, ok)).stages[0].name == "a.b"


GRID = {**CHAIN, "vocab": {**CHAIN["vocab"], "grid": {"vocab.vocab_size": [100, 200]}}}


def _grid_of(path: Path, *sets: str) -> list[dict[str, Any]]:
    spec = load_pipeline(path, sets)
    return [v.overrides for v in next(s for s in spec.stages if s.name == "vocab").variants]


def test_set_addresses_a_grid_key_with_dots(tmp_path: Path) -> None:
    """A grid key holds dots (`vocab.vocab_size`): `--set` split it at every dot, so the grid
    could not be changed, and the error named a key nobody wrote
    (`stages.vocab.grid.vocab: expected a non-empty list of values`)."""
    path = _write(tmp_path, GRID)
    assert _grid_of(path, "stages.vocab.grid.vocab.vocab_size=[300]") == [{"vocab.vocab_size": 300}]
    # a key the grid does not list yet is one more axis of it
    assert _grid_of(path, "stages.vocab.grid.vocab.character_coverage=[0.99, 1.0]") == [
        {"vocab.vocab_size": n, "vocab.character_coverage": c}
        for n in (100, 200)
        for c in (0.99, 1.0)
    ]
    err = _refused(path, "stages.vocab.grid.vocab.vocab_size=300")
    assert "stages.vocab.grid.vocab.vocab_size: expected a non-empty list" in err.message


def test_set_addresses_a_grid_key_of_a_shipped_pipeline() -> None:
    """The repro: the finetune grid of pipelines/dma_grid.yaml over `finetune.head`."""
    path = Path(__file__).resolve().parents[1] / "pipelines" / "dma_grid.yaml"
    spec = load_pipeline(path, ["stages.finetune.grid.finetune.head=[cnn]"])
    finetune = next(s for s in spec.stages if s.name == "finetune")
    assert {v.overrides["finetune.head"] for v in finetune.variants} == {"cnn"}


def test_set_addresses_a_tag_with_dots_in_a_pipeline(tmp_path: Path) -> None:
    """`pipeline run --set tracking.tags.team.name=nlp` (shared, or in a stage's config) made
    a nested {team: {name: nlp}} and was refused as 'config.tracking.tags.team', though the
    --set help says such a key is written in full."""
    path = _write(tmp_path, CHAIN)
    spec = load_pipeline(path, ["tracking.tags.team.name=nlp"])
    assert spec.config["tracking"]["tags"] == {"team.name": "nlp"}
    spec = load_pipeline(path, ["stages.vocab.config.tracking.tags.a.b=c"])
    vocab = next(s for s in spec.stages if s.name == "vocab")
    assert vocab.config["tracking"]["tags"] == {"a.b": "c"}


def test_a_dotted_tag_a_stage_sets_itself_is_said_not_to_reach_it(tmp_path: Path) -> None:
    """The 'does not reach' note split the key at every dot: a stage's own tag `team.name`
    kept its value under `--set tracking.tags.team.name=nlp` without a word."""
    own = {**CHAIN["vocab"], "config": {"tracking": {"tags": {"team.name": "own"}}}}
    path = _write(tmp_path, {**CHAIN, "vocab": own})
    notes = load_pipeline(path, ["tracking.tags.team.name=nlp"]).notes
    assert notes == [
        "--set tracking.tags.team.name does not reach stage vocab: its own config sets it "
        "(for that stage: --set stages.vocab.config.tracking.tags.team.name=...)"
    ]


def test_a_stage_name_with_dots_is_read_whole_in_references_and_set(tmp_path: Path) -> None:
    """A stage name may hold dots (load refuses only names that are no folder name), but
    `${stages.prep.v2.output}` was read as a reference to stage 'prep' ('not defined above it',
    or the wrong stage where one is so named), and `--set stages.prep.v2.inputs...` as a key of
    a stage 'prep'."""
    for name in ("x", "y", "z"):
        (tmp_path / name).write_text(name, encoding="utf-8")
    stages = {
        "prep.v2": {"kind": "v_pair", "inputs": {"left": str(tmp_path / "x")}},
        "prep": {"kind": "v_pair", "inputs": {"left": str(tmp_path / "y")}},
        "use": {
            "kind": "v_pair",
            "inputs": {"left": "${stages.prep.v2.output}", "right": "${stages.prep.output}"},
        },
    }
    to_z = f"stages.prep.v2.inputs.left={tmp_path / 'z'}"
    alone = load_pipeline(_write(tmp_path, {"prep.v2": stages["prep.v2"]}), [to_z])
    assert alone.stages[0].inputs == {"left": str(tmp_path / "z")}
    spec = load_pipeline(_write(tmp_path, stages), [to_z])
    assert [s.inputs["left"] for s in spec.stages[:2]] == [str(tmp_path / n) for n in "zy"]
    assert spec.stages[2].references() == ["prep.v2", "prep"]
    steps = Planner(spec).plan()
    keys = {s.node.stage.name: s.key for s in steps}
    assert steps[2].inputs == {"left": f"stage:{keys['prep.v2']}", "right": f"stage:{keys['prep']}"}


def test_a_variable_name_with_dots_is_read_whole(tmp_path: Path) -> None:
    """A variable `data.dir` could be set with --set but not read: `${vars.data.dir}` was
    split at every dot and called an unknown variable."""
    (tmp_path / "x").write_text("x", encoding="utf-8")
    (tmp_path / "y").write_text("y", encoding="utf-8")
    stages = {"a": {"kind": "v_pair", "inputs": {"left": "${vars.data.dir}"}}}
    path = _write(tmp_path, stages, vars={"data.dir": str(tmp_path / "x")})
    assert load_pipeline(path).stages[0].inputs == {"left": str(tmp_path / "x")}
    spec = load_pipeline(path, [f"vars.data.dir={tmp_path / 'y'}"])
    assert spec.stages[0].inputs == {"left": str(tmp_path / "y")}
    with pytest.raises(ConfigError, match=r"unknown variable \$\{vars\.data\.di\}"):
        load_pipeline(path, ["config.pretrain.max_steps=${vars.data.di}"])


def test_a_misspelt_stage_reference_is_refused_at_load(tmp_path: Path) -> None:
    """`${stages.a.outptu}` loaded, and only the plan (a `--dry-run` too) said 'unknown
    reference', naming no file; now the loader names the file, the key and the field."""
    (tmp_path / "x").write_text("x", encoding="utf-8")
    a = {"kind": "v_pair", "inputs": {"left": str(tmp_path / "x")}}
    b = {"kind": "v_pair", "inputs": {"left": "${stages.a.outptu}"}}
    path = _write(tmp_path, {"a": a, "b": b})
    err = _refused(path)
    assert err.message == (
        f"{path}: stages.b.inputs.left: ${{stages.a.outptu}}: stage 'a' has no field 'outptu'"
    )
    assert "${stages.a.output}" in str(err.hint)
    good = {**b, "inputs": {"left": "${stages.a.output}"}}
    spec = load_pipeline(_write(tmp_path, {"a": a, "b": good}))
    assert spec.stages[1].references() == ["a"]
    # as a --set writes it, in a stage's config, in a grid, in the shared config
    err = _refused(path := _write(tmp_path, {"a": a, "b": good}), "stages.b.inputs.right=${a}")
    assert err.message == f"{path}: stages.b.inputs.right: unknown reference ${{a}}"
    in_config = {**good, "config": {"pretrain": {"max_steps": "${stages.a.outptu}"}}}
    err = _refused(_write(tmp_path, {"a": a, "b": in_config}))
    assert "stages.b.config.pretrain.max_steps: ${stages.a.outptu}: stage 'a'" in err.message
    in_grid = {**good, "grid": {"tracking.tags.from": ["${stages.a.outptu}"]}}
    err = _refused(_write(tmp_path, {"a": a, "b": in_grid}))
    assert "stages.b: variant from=${stages.a.outptu} sets tracking.tags.from" in err.message
    shared = {"tracking": {"enabled": False, "tags": {"from": "${stagez.a.output}"}}}
    err = _refused(_write(tmp_path, {"a": a, "b": good}, config=shared))
    assert "config.tracking.tags.from: unknown reference ${stagez.a.output}" in err.message


def test_a_reference_to_a_later_or_missing_stage_is_told_apart(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("x", encoding="utf-8")
    a = {"kind": "v_pair", "inputs": {"left": "${stages.b.output}"}}
    b = {"kind": "v_pair", "inputs": {"left": str(tmp_path / "x")}}
    path = _write(tmp_path, {"a": a, "b": b})
    err = _refused(path)
    assert err.message.startswith(f"{path}: stages.a.inputs.left: references stage 'b', ")
    assert "a stage may read only stages above it" in err.message
    err = _refused(_write(tmp_path, {"b": b, "a": {**a, "inputs": {"left": "${stages.c.output}"}}}))
    assert "references stage 'c'" in err.message and "no stage is named 'c'" in str(err.hint)
