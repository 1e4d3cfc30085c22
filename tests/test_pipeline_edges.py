"""Edges of the pipeline mechanism: each test pins a defect found in review (and fixed)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tibnlp.errors import ConfigError
from tibnlp.pipeline import cache
from tibnlp.pipeline.context import StageContext
from tibnlp.pipeline.grid import expand
from tibnlp.pipeline.planner import Planner
from tibnlp.pipeline.registry import register_stage
from tibnlp.pipeline.runner import run_pipeline
from tibnlp.pipeline.spec import load_pipeline

READ: list[str] = []


def read_inputs(ctx: StageContext) -> dict[str, Any]:
    """Records the text of every input it is given (and writes two files)."""
    paths = ctx.inputs.values() if isinstance(ctx.inputs, dict) else ctx.inputs
    READ.extend(Path(p).read_text(encoding="utf-8") for p in paths)
    (ctx.output / "a.txt").write_text("a")
    (ctx.output / "b.txt").write_text("b")
    return {"n": 1}


register_stage("r_read", read_inputs, ("finetune",))


def _write(path: Path, stages: dict[str, Any]) -> Path:
    body = {
        "name": path.stem,
        "workdir": str(path.parent / f"work-{path.stem}"),
        "config": {"tracking": {"enabled": False}},
        "stages": stages,
    }
    path.write_text(yaml.safe_dump(body, sort_keys=False), encoding="utf-8")
    return path


def _quiet(_: str) -> None:
    pass


@pytest.fixture(autouse=True)
def _clear() -> None:
    READ.clear()


def test_relative_input_counts_from_the_working_directory(tmp_path: Path, monkeypatch) -> None:
    """A relative plain input, written in the file or set as a variable on the command line
    (`--set vars.model=runs/...`, as labels.yaml documents), names a path from where the command
    runs, as --workdir does; the key hashes the very file the stage then reads. It used to be
    checked beside the pipeline file and read from the working directory."""
    (tmp_path / "pipes").mkdir()
    (tmp_path / "pipes" / "in.txt").write_text("beside the pipeline file", encoding="utf-8")
    (tmp_path / "in.txt").write_text("in the working directory", encoding="utf-8")
    _write(tmp_path / "pipes" / "rel.yaml", {"r": {"kind": "r_read", "inputs": ["in.txt"]}})
    monkeypatch.chdir(tmp_path)
    run_pipeline(load_pipeline(Path("pipes/rel.yaml")), echo=_quiet)
    assert READ == ["in the working directory"]

    READ.clear()
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "model.txt").write_text("a model", encoding="utf-8")
    body = {
        "name": "var",
        "workdir": str(tmp_path / "work-var"),
        "vars": {"model": ""},
        "config": {"tracking": {"enabled": False}},
        "stages": {"r": {"kind": "r_read", "inputs": {"model": "${vars.model}"}}},
    }
    (tmp_path / "pipes" / "var.yaml").write_text(yaml.safe_dump(body), encoding="utf-8")
    spec = load_pipeline(Path("pipes/var.yaml"), ["vars.model=runs/model.txt"])
    step = Planner(spec).plan()[0]
    assert step.action == "run"
    run_pipeline(spec, echo=_quiet)
    assert READ == ["a model"]
    monkeypatch.chdir(tmp_path / "pipes")  # elsewhere, the same words name no file
    with pytest.raises(ConfigError, match="working directory"):
        Planner(load_pipeline(Path("var.yaml"), ["vars.model=runs/model.txt"])).plan()


def test_a_stage_reading_two_descendants_of_a_grid_gets_matching_variants(tmp_path: Path) -> None:
    """prepare (grid) -> vocab, and pretrain reading prepare and vocab: two pretrain nodes, each
    with the corpus and the vocabulary of the same prepare variant (not 2 x 2, half mismatched)."""
    path = _write(
        tmp_path / "diamond.yaml",
        {
            "prepare": {"kind": "r_read", "grid": {"corpus.min_syllables": [2, 3]}},
            "vocab": {"kind": "r_read", "inputs": {"corpus": "${stages.prepare.output}"}},
            "pretrain": {
                "kind": "r_read",
                "inputs": {
                    "corpus": "${stages.prepare.output}",
                    "vocab": "${stages.vocab.output}",
                },
            },
        },
    )
    nodes = [n for n in expand(load_pipeline(path)) if n.stage.name == "pretrain"]
    pairs = sorted((n.upstream["prepare"].name, n.upstream["vocab"].name) for n in nodes)
    assert pairs == [
        ("prepare[min_syllables=2]", "vocab[min_syllables=2]"),
        ("prepare[min_syllables=3]", "vocab[min_syllables=3]"),
    ]
    assert sorted(n.name for n in nodes) == [
        "pretrain[min_syllables=2]",
        "pretrain[min_syllables=3]",
    ]


def test_an_interrupted_republish_never_leaves_a_cached_half_output(
    tmp_path: Path, monkeypatch
) -> None:
    """A forced rerun replaces the published output. If that is interrupted while the old
    output is being deleted, the next plan must not take a half-deleted folder as cached."""
    path = _write(tmp_path / "repub.yaml", {"r": {"kind": "r_read"}})
    run_pipeline(load_pipeline(path), echo=_quiet)
    real = shutil.rmtree

    def interrupted_rmtree(target: Any, *args: Any, **kwargs: Any) -> None:
        victims = sorted(p for p in Path(target).iterdir() if not p.name.startswith("."))
        victims[0].unlink()  # some files are gone, then Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(cache.shutil, "rmtree", interrupted_rmtree)
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(load_pipeline(path), force=["r"], echo=_quiet)
    monkeypatch.setattr(cache.shutil, "rmtree", real)
    step = Planner(load_pipeline(path)).plan()[0]
    # the new output was in place before the old one was deleted: finished, and whole
    assert step.action == "skip"
    assert sorted(p.name for p in step.slot.final.iterdir() if p.name[0] != ".") == [
        "a.txt",
        "b.txt",
        "results.json",
    ]
    run_pipeline(load_pipeline(path), force=["r"], echo=_quiet)  # the next publish tidies up
    assert not list(step.slot.final.parent.glob(".*.old"))


def test_unknown_stage_kind_names_the_file_and_stage(tmp_path: Path) -> None:
    path = _write(tmp_path / "kind.yaml", {"a": {"kind": "r_read"}, "b": {"kind": "pretrian"}})
    with pytest.raises(ConfigError, match=r"kind\.yaml: stages\.b.*unknown stage kind"):
        Planner(load_pipeline(path)).plan()


def test_a_variant_may_reference_a_stage_above(tmp_path: Path) -> None:
    """`variants: [{set: {finetune.model: ${stages.a.output}}}]` is a reference like one in
    `config`: the stage reads `a` (no bare KeyError at plan time)."""
    path = _write(
        tmp_path / "varref.yaml",
        {
            "a": {"kind": "r_read"},
            "b": {
                "kind": "r_read",
                "variants": [{"name": "v", "set": {"finetune.model": "${stages.a.output}"}}],
            },
        },
    )
    steps = Planner(load_pipeline(path)).plan()
    assert steps[1].config["finetune"]["model"] == f"stage:{steps[0].key}"


@pytest.mark.parametrize("value", [None, 3])
def test_an_input_that_is_no_path_is_refused_at_plan_naming_its_key(
    tmp_path: Path, value: Any
) -> None:
    """`--set vars.model=null` (or a YAML `model:` left blank) used to plan as "run" and then
    crash the real run with a bare TypeError after the stages before it had run."""
    path = _write(tmp_path / "null.yaml", {"a": {"kind": "r_read", "inputs": {"model": value}}})
    with pytest.raises(ConfigError, match=r"stages\.a\.inputs\.model"):
        Planner(load_pipeline(path)).plan()


@pytest.mark.parametrize(
    ("values", "said"),
    [
        ("[1e-4, 0.0001]", r"lists 0\.0001 twice"),  # one number, as YAML reads it
        ("[1, '1']", r"values 1 and '1' both name the variant 'k=1'"),
    ],
)
def test_grid_values_that_name_one_variant_are_refused(
    tmp_path: Path, values: str, said: str
) -> None:
    """Two grid values that print alike made two nodes of one name: both ran (the same
    number twice over), MLflow got two runs of one name and one result overwrote the other
    in the pipeline's results."""
    path = tmp_path / "dup.yaml"
    path.write_text(f"stages:\n  r:\n    kind: r_read\n    grid: {{params.k: {values}}}\n")
    with pytest.raises(ConfigError, match=said) as err:
        load_pipeline(path)
    assert "stages.r.grid.params.k" in err.value.message


def test_variant_names_that_join_to_one_node_name_are_refused(tmp_path: Path) -> None:
    """Names joined across stages ("a,b" + "c" and "a" + "b,c") give one node name too."""
    path = _write(
        tmp_path / "joined.yaml",
        {
            "p": {"kind": "r_read", "variants": [{"name": n, "set": {}} for n in ("a,b", "a")]},
            "f": {
                "kind": "r_read",
                "inputs": ["${stages.p.output}"],
                "variants": [{"name": n, "set": {}} for n in ("c", "b,c")],
            },
        },
    )
    with pytest.raises(
        ConfigError, match=r"joined\.yaml: stages\.f: two runs are named f\[a,b,c\]"
    ):
        expand(load_pipeline(path))


def test_long_names_cut_alike_keep_their_own_last_run_pointer(tmp_path: Path) -> None:
    """File names are cut at 80 characters: two stages (or variants) sharing their first 80
    shared one `.last-*` pointer, so each explained its rerun against the other's config.
    Names that fit keep their pointer (its name, as before)."""
    long = "x" * 80

    def write(a: int, b: int) -> Path:
        return _write(
            tmp_path / "long.yaml",
            {
                f"{long}_a": {"kind": "r_read", "config": {"finetune": {"epochs": a}}},
                f"{long}_b": {"kind": "r_read", "config": {"finetune": {"epochs": b}}},
                "c": {"kind": "r_read", "grid": {"params.tag": [f"{long}1", f"{long}2"]}},
            },
        )

    run_pipeline(load_pipeline(write(1, 2)), echo=_quiet)
    steps = Planner(load_pipeline(write(3, 4))).plan()
    assert len({s.slot.last for s in steps}) == 4
    assert [s.reason for s in steps[:2]] == [
        "config changed: finetune.epochs: 1 -> 3",
        "config changed: finetune.epochs: 2 -> 4",
    ]
    short = cache.slot_for(tmp_path, "finetune", "small=6,head=cnn", "0" * 64)
    assert short.last.name == ".last-small=6_head=cnn.json"


def test_force_names_a_stage_or_node_of_the_pipeline(tmp_path: Path) -> None:
    """`--force pretrian` silently forced nothing: the cached result was reported as fresh."""
    path = _write(tmp_path / "force.yaml", {"r": {"kind": "r_read"}})
    run_pipeline(load_pipeline(path), echo=_quiet)
    with pytest.raises(ConfigError, match="--force R"):
        run_pipeline(load_pipeline(path), force=["R"], echo=_quiet)
    assert run_pipeline(load_pipeline(path), force=["r"], echo=_quiet).ran == ["r"]


def test_a_truncated_run_file_does_not_block_the_resume(tmp_path: Path) -> None:
    """The partial folder's run-id file is written atomically and an unreadable one (a kill
    or a full disk mid-write) starts a new MLflow run instead of a JSONDecodeError."""
    path = _write(tmp_path / "runfile.yaml", {"r": {"kind": "r_read"}})
    step = Planner(load_pipeline(path)).plan()[0]
    step.slot.partial.mkdir(parents=True)
    (step.slot.partial / ".tibnlp-run.json").write_text('{"run_id": "ab', encoding="utf-8")
    result = run_pipeline(load_pipeline(path), echo=_quiet)
    assert result.ran == ["r"]
    manifest = json.loads((step.slot.final / cache.MANIFEST).read_text())
    assert manifest["key"] == step.key
    assert not [p for p in os.listdir(step.slot.final) if p.startswith("..tibnlp-run")]


def test_a_forced_stage_reruns_the_stages_that_read_it(tmp_path: Path) -> None:
    """`--force a` replaces a's output under the same key; b, which read the old output, must
    not stay cached on it."""
    path = _write(
        tmp_path / "chain.yaml",
        {
            "a": {"kind": "r_read"},
            "b": {"kind": "r_read", "inputs": {"a": "${stages.a.output}/a.txt"}},
            "c": {"kind": "r_read"},
        },
    )
    assert run_pipeline(load_pipeline(path), echo=_quiet).ran == ["a", "b", "c"]
    steps = Planner(load_pipeline(path)).plan(force=["a"])
    assert [(s.node.name, s.action) for s in steps] == [("a", "run"), ("b", "run"), ("c", "skip")]
    assert "a runs first" in steps[1].reason
    assert run_pipeline(load_pipeline(path), force=["a"], echo=_quiet).ran == ["a", "b"]


def test_a_shared_set_that_a_stage_overrides_is_noted(tmp_path: Path) -> None:
    """`--set finetune.epochs=1` is the shared config: a stage setting epochs itself keeps its
    own value, and the plan says so instead of letting the user believe it took."""
    path = _write(
        tmp_path / "shadow.yaml",
        {
            "a": {"kind": "r_read"},
            "b": {"kind": "r_read", "config": {"finetune": {"epochs": 5}}},
            "c": {"kind": "r_read", "variants": [{"name": "v", "set": {"finetune.epochs": 7}}]},
        },
    )
    spec = load_pipeline(path, ["finetune.epochs=1", "engine.threads=1"])
    assert len(spec.notes) == 2
    assert "stage b: its own config sets it" in spec.notes[0]
    assert "stages.b.config.finetune.epochs" in spec.notes[0]
    assert "stage c: its variants (v) set it" in spec.notes[1]
    steps = Planner(spec).plan()
    epochs = {s.node.stage.name: s.config["finetune"]["epochs"] for s in steps}
    assert epochs == {"a": 1, "b": 5, "c": 7}
    lines: list[str] = []
    run_pipeline(spec, dry_run=True, echo=lines.append)
    assert sum("note: --set finetune.epochs does not reach" in line for line in lines) == 2
    assert load_pipeline(path, ["engine.threads=1"]).notes == []


def test_a_variant_setting_a_section_keeps_the_stages_other_keys(tmp_path: Path) -> None:
    """`set: {finetune: {patience: 1}}` sets one key of the section, as `--set` does; it used to
    replace the section, silently dropping the stage's other finetune keys."""
    path = _write(
        tmp_path / "section.yaml",
        {
            "b": {
                "kind": "r_read",
                "config": {"finetune": {"epochs": 7}},
                "variants": [{"name": "v", "set": {"finetune": {"patience": 1}}}],
            }
        },
    )
    config = Planner(load_pipeline(path)).plan()[0].config
    assert config["finetune"]["patience"] == 1 and config["finetune"]["epochs"] == 7


def test_a_data_input_naming_no_file_says_how_to_name_one(tmp_path: Path) -> None:
    path = _write(tmp_path / "nodata.yaml", {"a": {"kind": "r_read", "inputs": {"x": "data:"}}})
    with pytest.raises(ConfigError, match=r"'data:' names no file") as err:
        Planner(load_pipeline(path)).plan()
    assert "data:tncc/tncc_title_train.jsonl" in err.value.hint


def test_a_key_set_inside_a_value_names_the_value() -> None:
    from tibnlp.pipeline.keys import set_dotted

    data = {"finetune": {"head": "cnn"}}
    with pytest.raises(ConfigError, match=r"'finetune\.head\.kind' sets inside a value") as err:
        set_dotted(data, "finetune.head.kind", "mlp", "p.yaml: stages.f [v]")
    assert "'head' holds a value" in err.value.hint
    assert data == {"finetune": {"head": "cnn"}}


COUNT: list[int] = []
SEEN: list[tuple[bool, str]] = []
STOP: set[str] = set()


def count_up(ctx: StageContext) -> Path:
    """A new output on every run (a retrained model: same key, other weights); stopped
    (Ctrl-C) when named in STOP."""
    COUNT.append(len(COUNT) + 1)
    (ctx.output / "a.txt").write_text(str(COUNT[-1]))
    if ctx.name in STOP:
        STOP.discard(ctx.name)
        raise KeyboardInterrupt
    return ctx.output


def read_or_stop(ctx: StageContext) -> dict[str, Any]:
    """Records whether it resumes and what it read; stopped (Ctrl-C) when named in STOP."""
    SEEN.append((ctx.resume, Path(ctx.inputs["a"]).read_text(encoding="utf-8")))
    if ctx.name in STOP:
        STOP.discard(ctx.name)
        raise KeyboardInterrupt
    return {"n": 1}


register_stage("r_count", count_up, ("finetune",))
register_stage("r_stop", read_or_stop, ("finetune",))


def test_a_stage_cached_on_a_replaced_output_reruns_in_a_later_invocation(tmp_path: Path) -> None:
    """`--force a` republishes a under the same key; when b's rerun is interrupted, the next
    plain run used to skip b as cached (on a's old output), for the key b recorded is a's key.
    The manifest now records which publication of a it read; a partial made from an output
    since replaced is restarted, never resumed onto the new one."""
    COUNT.clear()
    SEEN.clear()
    path = _write(
        tmp_path / "repub.yaml",
        {
            "a": {"kind": "r_count"},
            "b": {"kind": "r_stop", "inputs": {"a": "${stages.a.output}/a.txt"}},
        },
    )
    run_pipeline(load_pipeline(path), echo=_quiet)
    STOP.add("b")
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(load_pipeline(path), force=["a"], echo=_quiet)
    steps = Planner(load_pipeline(path)).plan()
    assert [s.action for s in steps] == ["skip", "run"]
    assert steps[1].reason.startswith("a republished since this ran (resume")
    assert run_pipeline(load_pipeline(path), echo=_quiet).ran == ["b"]
    assert SEEN == [(False, "1"), (False, "2"), (True, "2")]  # resumed: made from a's 2nd
    assert [s.action for s in Planner(load_pipeline(path)).plan()] == ["skip", "skip"]

    SEEN.clear()
    STOP.add("b")  # a partial of b made from a's 2nd output...
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(load_pipeline(path), force=["b"], echo=_quiet)
    run_pipeline(load_pipeline(path), force=["a"], echo=_quiet)  # ...is not resumed on the 3rd
    assert SEEN == [(False, "2"), (False, "3")]
    SEEN.clear()
    STOP.add("b")
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(load_pipeline(path), force=["b"], echo=_quiet)
    run_pipeline(load_pipeline(path), force=["a"], until=["a"], echo=_quiet)
    step = Planner(load_pipeline(path)).plan()[1]
    assert step.reason.startswith("a republished since this ran")
    assert "resume" not in step.reason
    run_pipeline(load_pipeline(path), echo=_quiet)
    assert SEEN == [(False, "3"), (False, "4")]

    # manifests written before publications were recorded stay cached
    for s in Planner(load_pipeline(path)).plan():
        manifest = json.loads(s.slot.manifest_path.read_text())
        del manifest["upstream"], manifest["published"]
        manifest["finished"] = "2000-01-01T00:00:00Z"  # (written by an earlier version)
        s.slot.manifest_path.write_text(json.dumps(manifest))
    assert [s.action for s in Planner(load_pipeline(path)).plan()] == ["skip", "skip"]
    # ...and the first interrupted `--force a` after the upgrade leaves b's results of the
    # replaced a uncached: b's manifest holds no record, so times tell (a finished after it)
    SEEN.clear()
    STOP.add("b")
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(load_pipeline(path), force=["a"], echo=_quiet)
    step = Planner(load_pipeline(path)).plan()[1]
    assert step.action == "run" and step.reason.startswith("a republished since this ran")


def test_the_interrupt_hint_drops_the_force_of_stages_already_republished(tmp_path: Path) -> None:
    """After `--force a` was interrupted in b, "run the same command again" forced a again:
    its finished retraining ran from scratch. The hint names the command that goes on."""
    COUNT.clear()
    path = _write(
        tmp_path / "hint.yaml",
        {
            "a": {"kind": "r_count", "grid": {"finetune.epochs": [1, 2]}},
            "b": {"kind": "r_stop", "inputs": {"a": "${stages.a.output}/a.txt"}},
        },
    )
    run_pipeline(load_pipeline(path), echo=_quiet)
    lines: list[str] = []
    STOP.add("b[epochs=1]")
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(load_pipeline(path), force=["a"], echo=lines.append)
    assert lines[-1].endswith(
        "run the same command without --force a to continue from it (the stages it "
        "republished stay cached: forced again, they would run from scratch)"
    )
    lines.clear()
    STOP.add("a[epochs=2]")
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(load_pipeline(path), force=["a", "b"], echo=lines.append)
    assert "with --force 'a[epochs=2]' --force b in place of --force a --force b" in lines[-1]
    lines.clear()
    STOP.add("b[epochs=1]")  # the forced stage itself: forced again, it resumes its partial
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(load_pipeline(path), force=["b"], echo=lines.append)
    assert "; run the same command again to continue" in lines[-1]
