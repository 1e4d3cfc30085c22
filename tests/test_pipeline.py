"""Pipelines: stages chained by YAML, content-addressed outputs, resume, grids, MLflow runs.

The mechanism is pinned with small registered test stages; the real stages are adapters of the
same shape (tibnlp/pipeline/stages.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tibnlp.errors import ConfigError
from tibnlp.pipeline.context import StageContext
from tibnlp.pipeline.registry import register_stage
from tibnlp.pipeline.runner import run_pipeline
from tibnlp.pipeline.spec import load_pipeline
from tibnlp.tracking.testing import sqlite_store

TOY_TEXT = "ཀ་ཁ་ག།\n"
CALLS: list[str] = []
FAIL_ONCE: set[str] = set()


def make_text(ctx: StageContext) -> Path:
    """Concatenate the inputs and repeat them `pretrain.max_steps` times."""
    CALLS.append(ctx.name)
    text = "".join(Path(p).read_text(encoding="utf-8") for p in ctx.inputs)
    out = ctx.output / "text.txt"
    out.write_text(text * ctx.config.pretrain.max_steps, encoding="utf-8")
    return out


def train(ctx: StageContext) -> Path:
    """A fake model dir; fails once (after writing a checkpoint) when asked, to test resume."""
    CALLS.append(f"{ctx.name}{'(resume)' if ctx.resume else ''}")
    ckpt = ctx.output / "model" / "checkpoint.txt"
    ckpt.parent.mkdir(exist_ok=True)
    if ctx.resume:
        assert ckpt.read_text() == "half"
    ckpt.write_text("half")
    if ctx.name in FAIL_ONCE:
        FAIL_ONCE.discard(ctx.name)
        raise RuntimeError("interrupted")
    for step in range(3):
        ctx.tracker.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
    text = Path(ctx.inputs["text"]).read_text(encoding="utf-8")
    (ctx.output / "model" / "weights.txt").write_text(f"{ctx.config.model.heads.small}:{len(text)}")
    return ctx.output / "model"


def evaluate(ctx: StageContext) -> dict[str, float]:
    CALLS.append(ctx.name)
    weights = (Path(ctx.inputs["model"]) / "weights.txt").read_text()
    heads = int(weights.split(":")[0])
    head_bonus = 0.1 if ctx.config.finetune.head == "cnn" else 0.0
    return {"test_f1_macro": heads / 100 + head_bonus, "test_f1_weighted": heads / 50}


register_stage("t_text", make_text, ("pretrain",))
register_stage("t_train", train, ("model",))
register_stage("t_eval", evaluate, ("finetune",))

PIPELINE = """
name: toy
experiment: toy-exp
workdir: {workdir}
vars: {{repeat: 2}}
config:
  tracking: {{uri: "{uri}"}}
stages:
  text:
    kind: t_text
    inputs: ["data:corpora/toy.txt"]
    config: {{pretrain: {{max_steps: "${{vars.repeat}}"}}}}
  pretrain:
    kind: t_train
    inputs:
      text: ${{stages.text.output}}
    grid: {{model.heads.small: [6, 12]}}
  finetune:
    kind: t_eval
    inputs:
      model: ${{stages.pretrain.output}}
    grid: {{finetune.head: [cnn, linear]}}
"""


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    data = tmp_path / "data" / "corpora"
    data.mkdir(parents=True)
    (data / "toy.txt").write_text(TOY_TEXT, encoding="utf-8")
    monkeypatch.setenv("TIBNLP_DATA", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    uri = sqlite_store(tmp_path)
    path = tmp_path / "toy.yaml"
    path.write_text(PIPELINE.format(workdir=tmp_path / "work", uri=uri), encoding="utf-8")
    CALLS.clear()
    FAIL_ONCE.clear()
    return path, uri


def _plan(path: Path, *overrides: str) -> dict[str, str]:
    lines: list[str] = []
    run_pipeline(load_pipeline(path, overrides), dry_run=True, echo=lines.append)
    return {ln.split()[1]: ln.split()[0] for ln in lines[1:]}


def test_runs_then_skips_everything_and_logs_nested_runs(toy: tuple[Path, str]) -> None:
    path, uri = toy
    assert set(_plan(path).values()) == {"run"}
    first = run_pipeline(load_pipeline(path), echo=lambda _: None)
    assert len(first.ran) == 7 and not first.skipped  # 1 + 2 + 2x2
    assert sorted(CALLS) == sorted(first.ran)
    assert first.results["finetune[small=12,head=cnn]"]["test_f1_macro"] == pytest.approx(0.22)
    weights = first.outputs["pretrain[small=6]"] / "weights.txt"
    assert weights.read_text() == f"6:{len(TOY_TEXT) * 2}"

    CALLS.clear()
    again = run_pipeline(load_pipeline(path), echo=lambda _: None)
    assert again.ran == [] and len(again.skipped) == 7 and CALLS == []
    assert again.outputs == first.outputs
    assert set(_plan(path).values()) == {"skip"}

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("toy-exp")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1  # the fully cached second invocation opens no empty run
    assert again.run_id is None
    kids = {r.info.run_name: r for r in runs if "mlflow.parentRunId" in r.data.tags}
    assert len(kids) == 7
    ft = kids["finetune[small=6,head=linear]"]
    assert ft.data.tags["mlflow.parentRunId"] == first.run_id
    assert ft.data.tags["tibnlp.model"] == "small=6"
    assert ft.data.tags["tibnlp.stage"] == "finetune"
    assert ft.data.params["finetune.head"] == "linear"
    assert ft.data.metrics["test_f1_macro"] == pytest.approx(0.06)
    assert "tibnlp.parent_model_hash" in ft.data.tags and "tibnlp.git_commit" in ft.data.tags
    pre = kids["pretrain[small=12]"]
    assert [m.step for m in client.get_metric_history(pre.info.run_id, "loss")] == [0, 1, 2]
    assert pre.data.params["model.heads.small"] == "12"
    # empty paths are left for the stage to log with their real values (MLFlow refuses changes)
    assert "" not in pre.data.params.values() and "pretrain.corpus" not in pre.data.params
    names = {a.path for a in client.list_artifacts(pre.info.run_id, "config")}
    assert names == {"config/resolved.yaml"}


def test_change_reruns_only_what_depends_on_it(toy: tuple[Path, str]) -> None:
    path, _ = toy
    run_pipeline(load_pipeline(path), echo=lambda _: None)
    plan = _plan(path, "finetune.epochs=3")  # base config: only finetune hashes it
    assert [n for n, a in plan.items() if a == "run"] == [
        "finetune[small=6,head=cnn]",
        "finetune[small=6,head=linear]",
        "finetune[small=12,head=cnn]",
        "finetune[small=12,head=linear]",
    ]
    lines: list[str] = []
    run_pipeline(load_pipeline(path, ["vars.repeat=3"]), dry_run=True, echo=lines.append)
    text = "\n".join(lines)
    assert "config changed: pretrain.max_steps: 2 -> 3" in text
    assert "input changed: text runs first" in text
    CALLS.clear()
    run_pipeline(load_pipeline(path, ["vars.repeat=3"]), echo=lambda _: None)
    assert len(CALLS) == 7


def test_data_change_invalidates(toy: tuple[Path, str], tmp_path: Path) -> None:
    path, _ = toy
    run_pipeline(load_pipeline(path), echo=lambda _: None)
    (tmp_path / "data" / "corpora" / "toy.txt").write_text("ཀ་\n", encoding="utf-8")
    assert set(_plan(path).values()) == {"run"}


def test_interrupted_stage_resumes_and_never_publishes_half(toy: tuple[Path, str]) -> None:
    path, _ = toy
    FAIL_ONCE.add("pretrain[small=12]")
    with pytest.raises(RuntimeError, match="interrupted"):
        run_pipeline(load_pipeline(path), echo=lambda _: None)
    work = path.parent / "work" / "pretrain"
    assert [p.name.endswith(".partial") for p in sorted(work.iterdir()) if p.is_dir()].count(
        True
    ) == 1
    assert not any(
        p.name.startswith("small=12") and not p.name.endswith(".partial") for p in work.iterdir()
    )
    lines: list[str] = []
    run_pipeline(load_pipeline(path), dry_run=True, echo=lines.append)
    assert any("pretrain[small=12]" in ln and "resume the interrupted run" in ln for ln in lines)
    CALLS.clear()
    second = run_pipeline(load_pipeline(path), echo=lambda _: None)
    assert "pretrain[small=12](resume)" in CALLS
    assert "text" in second.skipped and "pretrain[small=6]" in second.skipped
    assert len(second.ran) == 5  # the resumed pretrain and the 4 fine-tunings after it
    manifest = json.loads(
        (second.outputs["pretrain[small=12]"].parent / ".tibnlp-stage.json").read_text()
    )
    assert manifest["output_rel"] == "model" and manifest["stage"] == "pretrain"
    # the resumed stage continued its MLflow run (now under the second pipeline run)
    client = MlflowClient(toy[1])
    exp = client.get_experiment_by_name("toy-exp")
    pre = client.search_runs([exp.experiment_id], "attributes.run_name = 'pretrain[small=12]'")
    assert len(pre) == 1 and pre[0].info.status == "FINISHED"
    assert pre[0].data.tags["mlflow.parentRunId"] == second.run_id


def test_cli_dry_run_and_errors(toy: tuple[Path, str]) -> None:
    from typer.testing import CliRunner

    from tibnlp.cli.main import app

    path, _ = toy
    result = CliRunner().invoke(app, ["pipeline", "run", str(path), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "pipeline toy: 7 stage runs" in result.output
    assert "finetune[small=12,head=linear]" in result.output and CALLS == []
    result = CliRunner().invoke(
        app, ["pipeline", "run", str(path), "--dry-run", "-s", "stages.text.bogus=1"]
    )
    assert isinstance(result.exception, ConfigError)


def test_a_tracking_uri_mlflow_refuses_is_a_config_error(
    toy: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--tracking-uri ./mlruns` ended the run in a traceback once the plan was printed."""
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    path, _ = toy
    (tmp_path / "mlruns").mkdir()
    with pytest.raises(ConfigError, match=r"tracking store \./mlruns") as err:
        run_pipeline(load_pipeline(path), tracking_uri="./mlruns", echo=lambda _: None)
    assert CALLS == []
    # the hint names an option `pipeline run` has (its --set tracking.uri= too)
    assert "given by --tracking-uri" in err.value.message
    assert "(--tracking-uri sqlite:///mlflow.db)" in str(err.value.hint)


def test_explicit_variants_and_errors(toy: tuple[Path, str], tmp_path: Path) -> None:
    path, _ = toy
    data = yaml.safe_load(path.read_text())
    data["stages"]["pretrain"].pop("grid")
    data["stages"]["pretrain"]["variants"] = [
        {"name": "fixed8", "set": {"model.heads.small": 8, "model.heads.large": 8}},
        {"name": "dma6-12", "set": {"model.heads.small": 6, "model.heads.large": 12}},
    ]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    plan = _plan(path)
    assert "pretrain[fixed8]" in plan and "finetune[dma6-12,head=cnn]" in plan

    bad = dict(data, stages={"b": {"kind": "t_eval", "inputs": {"m": "${stages.later.output}"}}})
    path.write_text(yaml.safe_dump(bad, sort_keys=False))
    with pytest.raises(ConfigError, match="references stage 'later'"):
        load_pipeline(path)
    data["stages"]["pretrain"]["variants"][0]["set"] = {"model.heads.smal": 8}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ConfigError, match=r"pretrain \[fixed8\].*model.heads.smal"):
        _plan(path)
    with pytest.raises(ConfigError, match="unknown variable"):
        load_pipeline(path, ["config.pretrain.max_steps=${vars.nope}"])
    data["stagez"] = {}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ConfigError, match="unknown top-level key 'stagez'"):
        load_pipeline(path)


def test_missing_data_names_the_data_directory(toy: tuple[Path, str]) -> None:
    path, _ = toy
    text = path.read_text().replace("data:corpora/toy.txt", "data:corpora/absent.txt")
    path.write_text(text)
    from tibnlp.errors import DataError

    with pytest.raises(DataError, match=r"absent\.txt"):
        _plan(path)


def test_finetune_adapter_registers_the_model(toy: tuple[Path, str], tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from tibnlp.config import load_config
    from tibnlp.pipeline.stages import register_finetuned
    from tibnlp.tracking import Tracker

    _, uri = toy
    out = tmp_path / "ft"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"\0")
    cfg = load_config(overrides=[f"finetune.output={out}", "tracking.register_model=tncc-title"])
    with Tracker("reg", "finetune", uri=uri) as tracker:
        ctx = StageContext("finetune", "finetune", "", cfg, [], tmp_path, False, tracker)
        result = {"test_f1_macro": 0.5, "val_f1_macro": 0.6}
        register_finetuned(ctx, result)
        register_finetuned(ctx, result)  # once per result
    assert result["registered_model"] == "tncc-title"
    (version,) = MlflowClient(uri).search_model_versions("name='tncc-title'")
    assert version.tags == {"test_f1_macro": "0.5"}


def test_builtin_adapters_wire_the_real_stage_signatures(
    toy: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """prepare -> vocab -> pretrain -> finetune through the built-in kinds, with stand-ins of
    the stage functions (same signatures), so the wiring is pinned without training."""
    import sys
    import types
    from dataclasses import dataclass, field

    from tibnlp.tracking import tracker_from_config

    def prepare_corpus(inputs, output, cfg):
        assert not output.exists()
        output.mkdir()
        (output / "docs.txt").write_text("".join(Path(p).read_text() for p in inputs))
        return {"documents": 1}

    def build_vocabulary(corpus_dir, output_dir, config):
        output_dir.mkdir()
        (output_dir / "vocab.txt").write_text(f"{config.vocab_size}")
        return {}

    def run_pretraining(cfg, resume=False):
        assert (Path(cfg.pretrain.corpus) / "docs.txt").is_file()
        if cfg.pretrain.init_from:  # continued pretraining: the model carries its vocabulary
            assert cfg.pretrain.vocab == cfg.pretrain.init_from
            assert Path(cfg.pretrain.init_from).name == "final"
            assert cfg.pretrain.max_tokens == 77  # the stage's own config
        else:
            assert (Path(cfg.pretrain.vocab) / "vocab.txt").read_text() == "123"
            assert not cfg.pretrain.max_tokens
        with tracker_from_config(cfg.tracking, "pretrain") as tr:
            tr.log_metrics({"mask_loss": 5.0}, step=1)
        model = Path(cfg.pretrain.output) / "final"
        model.mkdir(parents=True)
        (model / "model.safetensors").write_bytes(b"\0")
        return model

    @dataclass
    class FinetuneResult:
        system: str
        dataset: str
        aggregate: dict = field(default_factory=dict)
        output: Path = Path()

    def run_finetune(cfg, dataset, task="title"):
        assert (Path(cfg.finetune.model) / "model.safetensors").is_file()
        out = Path(cfg.finetune.output) / "tncc_title"
        out.mkdir(parents=True)
        (out / "model.safetensors").write_bytes(b"\1")
        agg = {"test": {"f1_macro": (0.5, 0.01)}, "validation": {"f1_macro": (0.6, 0.02)}}
        return FinetuneResult("albert+cnn", dataset, agg, out)

    for name, fn in [
        ("tibnlp.text.prepare", prepare_corpus),
        ("tibnlp.text.vocab_build", build_vocabulary),
        ("tibnlp.training.pretrain", run_pretraining),
        ("tibnlp.training.finetune", run_finetune),
    ]:
        module = types.ModuleType(name)
        setattr(module, fn.__name__, fn)
        monkeypatch.setitem(sys.modules, name, module)

    path, uri = toy
    path.write_text(
        yaml.safe_dump(
            {
                "name": "chain",
                "workdir": str(tmp_path / "chain"),
                "config": {"tracking": {"uri": uri, "register_model": "chain-model"}},
                "stages": {
                    "prepare": {"inputs": ["data:corpora/toy.txt"]},
                    "vocab": {
                        "inputs": {"corpus": "${stages.prepare.output}"},
                        "config": {"vocab": {"vocab_size": 123}},
                    },
                    "pretrain": {
                        "inputs": {
                            "corpus": "${stages.prepare.output}",
                            "vocab": "${stages.vocab.output}",
                        }
                    },
                    "adapt": {
                        "kind": "pretrain",
                        "inputs": {
                            "corpus": "${stages.prepare.output}",
                            "vocab": "${stages.pretrain.output}",
                            "init": "${stages.pretrain.output}",
                        },
                        "config": {"pretrain": {"max_tokens": 77}},
                    },
                    "finetune": {"inputs": {"model": "${stages.adapt.output}"}},
                },
            },
            sort_keys=False,
        )
    )
    result = run_pipeline(load_pipeline(path), echo=lambda _: None)
    assert result.ran == ["prepare", "vocab", "pretrain", "adapt", "finetune"]
    assert result.outputs["adapt"].parent.parent.parent.name == "adapt"
    assert result.outputs["pretrain"].name == "final"
    assert result.results["finetune"]["test_f1_macro"] == 0.5
    assert result.results["finetune"]["registered_model"] == "chain-model"
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("pipeline-chain")
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    assert set(runs) == {"chain", "prepare", "vocab", "pretrain", "adapt", "finetune"}
    assert runs["prepare"].data.metrics["documents"] == 1  # the stage's report
    assert runs["pretrain"].data.metrics["mask_loss"] == 5.0  # the stage logged into its run
    assert runs["finetune"].data.metrics["test_f1_macro_std"] == pytest.approx(0.01)
    assert "tibnlp.vocab_hash" in runs["pretrain"].data.tags
    (version,) = client.search_model_versions("name='chain-model'")
    assert version.run_id == runs["finetune"].info.run_id
    assert run_pipeline(load_pipeline(path), echo=lambda _: None).ran == []


def test_launched_stage_runs_in_a_child_process(toy: tuple[Path, str], tmp_path: Path) -> None:
    """`launch:` runs the stage through a launcher (here plain `python -m`, as torchrun would
    with one process); the output is published and the stage's run gets its report."""
    import sys

    path, uri = toy
    path.write_text(
        yaml.safe_dump(
            {
                "name": "launched",
                "workdir": str(tmp_path / "launched"),
                "config": {"tracking": {"uri": uri}},
                "stages": {
                    "cut": {
                        "kind": "slice",
                        "inputs": ["data:corpora/toy.txt"],
                        "params": {"max_docs": 1},
                        "launch": f"{sys.executable} -m",
                    }
                },
            },
            sort_keys=False,
        )
    )
    result = run_pipeline(load_pipeline(path), echo=lambda _: None)
    out = result.outputs["cut"]
    assert out.name == "slice.txt" and out.read_text(encoding="utf-8") == TOY_TEXT + "\n"
    assert sorted(p.name for p in out.parent.iterdir()) == [
        ".tibnlp-run.json",
        ".tibnlp-stage.json",
        "slice.txt",
    ]
    assert run_pipeline(load_pipeline(path), echo=lambda _: None).skipped == ["cut"]


@pytest.mark.parametrize("checkpointed", [False, True])
def test_pretrain_stage_resumes_only_from_a_checkpoint(
    checkpointed: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupted pretrain stage continues from its last checkpoint; one interrupted before
    the first checkpoint starts over (run_pretraining refuses `resume` with no checkpoint)."""
    import sys
    import types

    from tibnlp.config import Config
    from tibnlp.pipeline import stages
    from tibnlp.pipeline.context import StageContext
    from tibnlp.tracking import Tracker

    calls: list[bool] = []

    def run_pretraining(cfg: Config, resume: bool = False) -> Path:
        calls.append(resume)
        return Path(cfg.pretrain.output) / "model"

    module = types.ModuleType("tibnlp.training.pretrain")
    module.run_pretraining = run_pretraining  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tibnlp.training.pretrain", module)
    partial = tmp_path / "pretrain.partial"
    left = partial / "model" / "data"
    left.mkdir(parents=True)
    if checkpointed:
        (partial / "model" / "checkpoints" / "step-15").mkdir(parents=True)
        (partial / "model" / "checkpoints" / "latest").write_text("step-15")
    inputs = {"corpus": tmp_path / "corpus", "vocab": tmp_path / "vocab"}
    tracker = Tracker("x", enabled=False)
    ctx = StageContext("pretrain", "pretrain", "", Config(), inputs, partial, True, tracker)
    stages.pretrain(ctx)
    assert calls == [checkpointed]
    assert left.exists() == checkpointed  # no checkpoint: the partial output starts clean


KEYS = """
name: keys
workdir: {workdir}
stages:
  pretrain:
    inputs: {{corpus: "data:corpora/toy.txt", vocab: "data:corpora/toy.txt"}}
  finetune:
    inputs: {{model: "${{stages.pretrain.output}}"}}
"""


KEYED_AT_DEFAULT = {
    *("batch_size", "checkpoint_every", "corpus", "eval_batches", "eval_every"),
    *("export_at_tokens", "keep_checkpoints", "log_every", "mask_prob", "masking", "max_ngram"),
    *("max_steps", "max_tokens", "micro_batch_size", "optimizer", "output"),
    *("recurrence_segments", "seed", "seq_len", "sop", "sop_prob", "sparse_last_layer"),
    *("time_budget", "vocab", "warn_after"),
}


def test_cache_key_holds_what_changes_the_output(toy: tuple[Path, str], tmp_path: Path) -> None:
    """Precision enters the pretraining and fine-tuning keys; log cadence and speed knobs do
    not; a default engine, or no init_from, leaves the key as it was before they existed."""
    from tibnlp.pipeline.cache import node_key
    from tibnlp.pipeline.planner import Planner

    path = tmp_path / "keys.yaml"
    path.write_text(KEYS.format(workdir=tmp_path / "work"), encoding="utf-8")

    def keys(*overrides: str) -> dict[str, str]:
        steps = Planner(load_pipeline(path, overrides)).plan()
        return {s.node.name: s.key for s in steps}

    base, fp32, bf16 = keys(), keys("engine.precision=fp32"), keys("engine.precision=bf16")
    for stage in ("pretrain", "finetune"):
        assert len({base[stage], fp32[stage], bf16[stage]}) == 3
    assert keys("pretrain.log_every=1", "pretrain.warn_after=0") == base
    assert keys("engine.threads=1", "engine.num_workers=2", "engine.port=29500") == base
    assert keys("pretrain.checkpoint_every=5")["pretrain"] != base["pretrain"]
    assert keys("engine.zero_stage=1")["pretrain"] != base["pretrain"]

    planner = Planner(load_pipeline(path))
    step = planner.plan()[0]
    cfg = planner.config_dict(step.node, real=False)
    # the key made before `engine`, `pretrain.init_from`, the ELECTRA, skip-gram, word-table
    # contrast and rare-first masking settings existed is still the key
    later = {"init_from", "objective", "generator_ratio", "rtd_weight", "skipgram", "word_lr"}
    later |= {"contrastive", "contrastive_temperature", "mask_rarity"}
    before = {k: v for k, v in cfg["pretrain"].items() if k not in later}
    # a new pretraining setting must join ADDED_WHEN_SET (and `later`), or every cached
    # pretraining stage would rerun after an upgrade: the keys that enter at their defaults
    assert set(before) == KEYED_AT_DEFAULT
    old = {"model": cfg["model"], "pretrain": before}
    assert step.key == node_key("pretrain", old, {}, step.inputs)
    assert keys("pretrain.init_from=runs/m")["pretrain"] != base["pretrain"]
    assert keys("pretrain.skipgram.epochs=2")["pretrain"] != base["pretrain"]
    assert keys("pretrain.mask_rarity=0.5")["pretrain"] != base["pretrain"]
    assert keys("pretrain.word_lr=1e-4")["pretrain"] != base["pretrain"]
    mlm = keys("pretrain.sop=false")["pretrain"]
    assert keys("pretrain.sop=false", "pretrain.objective=electra")["pretrain"] != mlm


def test_vocab_switches_enter_the_key_only_when_set() -> None:
    """vocab.whole_units and vocab.punctuation_pieces came later: at their defaults a vocab
    stage (and all that reads it) keeps the key it had before they existed."""
    from tibnlp.config import Config
    from tibnlp.config.core import to_dict
    from tibnlp.config.identity import output_settings

    config = to_dict(Config())
    before = {
        k: v for k, v in config["vocab"].items() if k not in {"whole_units", "punctuation_pieces"}
    }
    assert output_settings(config, ("vocab",)) == {"vocab": before}
    for key in ("whole_units", "punctuation_pieces"):
        changed = {**config, "vocab": {**config["vocab"], key: True}}
        assert output_settings(changed, ("vocab",))["vocab"] == {**before, key: True}


def test_skipgram_settings_added_later_enter_the_key_only_when_set() -> None:
    """pretrain.skipgram.ngram_* came after the skip-gram start: a pipeline that sets
    skipgram.epochs (the main job) kept its corpus stage's key only while they stayed out of
    the hashed skipgram section at their defaults; they went in, and an upgrade reran the
    main job from its pretraining on."""
    from tibnlp.config import Config
    from tibnlp.config.core import to_dict
    from tibnlp.config.identity import output_settings

    config = to_dict(Config())
    config["pretrain"]["skipgram"] = {**config["pretrain"]["skipgram"], "epochs": 5}
    hashed = output_settings(config, ("pretrain",))["pretrain"]["skipgram"]
    assert hashed["epochs"] == 5 and not {"ngram_buckets", "ngram_min", "ngram_max"} & set(hashed)
    config["pretrain"]["skipgram"]["ngram_buckets"] = 1000
    hashed = output_settings(config, ("pretrain",))["pretrain"]["skipgram"]
    assert hashed["ngram_buckets"] == 1000 and "ngram_min" not in hashed
    # at its defaults the whole section stays out, as before
    assert "skipgram" not in output_settings(to_dict(Config()), ("pretrain",))["pretrain"]


def test_paths_a_stage_sets_itself_stay_out_of_its_key(
    toy: tuple[Path, str], tmp_path: Path
) -> None:
    """The adapters set pretrain.output, .corpus, .vocab (and .init_from from an `init` input),
    finetune.output (and .model, .vocab from inputs of those names) themselves: a value in the
    config never reaches the stage, and changing it reran the stage for nothing. A path no
    input fills still counts; a config that sets none keeps the key it had."""
    from tibnlp.pipeline.cache import node_key
    from tibnlp.pipeline.planner import Planner

    path = tmp_path / "keys.yaml"
    path.write_text(KEYS.format(workdir=tmp_path / "work"), encoding="utf-8")

    def keys(*overrides: str) -> dict[str, str]:
        steps = Planner(load_pipeline(path, overrides)).plan()
        return {s.node.name: s.key for s in steps}

    base = keys()
    filled = ["pretrain.output=elsewhere", "pretrain.corpus=c", "pretrain.vocab=v"]
    assert keys(*filled, "finetune.output=x", "finetune.model=m") == base
    assert keys("finetune.vocab=v")["finetune"] != base["finetune"]  # no vocab input
    assert keys("pretrain.init_from=runs/m")["pretrain"] != base["pretrain"]  # no init input
    step = Planner(load_pipeline(path)).plan()[0]
    assert step.config["pretrain"]["output"] == "runs/pretrain"  # the default, as before
    assert step.key == node_key("pretrain", step.config, {}, step.inputs)

    path.write_text(
        KEYS.format(workdir=tmp_path / "work").replace(
            'vocab: "data:corpora/toy.txt"}', 'vocab: "data:corpora/toy.txt", init: "data:x.txt"}'
        ),
        encoding="utf-8",
    )
    (tmp_path / "data" / "x.txt").write_text("m", encoding="utf-8")
    with_init = keys()["pretrain"]
    assert with_init != base["pretrain"]  # the input counts
    assert keys("pretrain.init_from=runs/m")["pretrain"] == with_init


def test_until_runs_a_stage_and_what_it_reads_only(toy: tuple[Path, str]) -> None:
    """`--until pretrain` is a make target: text and both pretrain variants run, finetune is
    left out (shown in the plan); the full run afterwards reuses them and runs finetune."""
    path, _ = toy
    lines: list[str] = []
    run_pipeline(load_pipeline(path), dry_run=True, echo=lines.append, until=["pretrain"])
    plan = {ln.split()[1]: ln.split()[0] for ln in lines[1:]}
    assert [n for n, a in plan.items() if a == "run"] == [
        "text",
        "pretrain[small=6]",
        "pretrain[small=12]",
    ]
    assert [n for n, a in plan.items() if a == "left"] == [
        "finetune[small=6,head=cnn]",
        "finetune[small=6,head=linear]",
        "finetune[small=12,head=cnn]",
        "finetune[small=12,head=linear]",
    ]
    assert "not needed by --until pretrain" in lines[-1]
    first = run_pipeline(load_pipeline(path), echo=lambda _: None, until=["pretrain"])
    assert first.ran == ["text", "pretrain[small=6]", "pretrain[small=12]"]
    assert sorted(CALLS) == sorted(first.ran)
    CALLS.clear()
    rest = run_pipeline(load_pipeline(path), echo=lambda _: None)
    assert rest.skipped == first.ran and len(rest.ran) == 4 and sorted(CALLS) == sorted(rest.ran)


def test_a_plan_refused_under_the_lock_leaves_no_work_dir(toy: tuple[Path, str]) -> None:
    """The work dir is made to hold its lock; a run refused while planning leaves none."""
    path, _ = toy
    with pytest.raises(ConfigError, match="--until twin"):
        run_pipeline(load_pipeline(path), echo=lambda _: None, until=["twin"])
    assert not (path.parent / "work").exists()


def test_until_names_an_unknown_stage(toy: tuple[Path, str]) -> None:
    from typer.testing import CliRunner

    from tibnlp.cli.main import app

    path, _ = toy
    with pytest.raises(ConfigError, match="--until twin: the pipeline has no such stage") as err:
        run_pipeline(load_pipeline(path), dry_run=True, echo=lambda _: None, until=["twin"])
    assert "text, pretrain, finetune" in (err.value.hint or "")
    result = CliRunner().invoke(app, ["pipeline", "run", str(path), "--until", "text"])
    assert result.exit_code == 0, result.output
    assert "left  pretrain[small=6]" in result.output and CALLS == ["text"]
    first = " ".join(result.output.split())
    assert "1 ran, 0 cached" in first and "every stage cached" not in first
    again = CliRunner().invoke(app, ["pipeline", "run", str(path), "--until", "text"])
    assert again.exit_code == 0 and CALLS == ["text"], again.output
    said = " ".join(again.output.split())  # the console wraps at its width
    assert "(every stage cached: no new run)" in said and "run None" not in said
    off = ["--until", "text", "--force", "text", "--set", "tracking.enabled=false"]
    quiet = CliRunner().invoke(app, ["pipeline", "run", str(path), *off])
    assert quiet.exit_code == 0, quiet.output
    assert "(tracking off: nothing logged)" in " ".join(quiet.output.split())


def test_an_output_revision_reruns_only_its_stage_kind(monkeypatch) -> None:
    """OUTPUT_REVISION: a code change that alters what a stage kind writes gives that kind new
    keys (its cached outputs run again); kinds at revision 1 keep the keys they had."""
    from tibnlp.pipeline import cache
    from tibnlp.tracking.conventions import config_hash

    def bare(kind: str) -> str:  # the key as made before revisions existed
        return config_hash(
            {"salt": cache._SALT, "kind": kind, "config": {}, "params": {}, "inputs": []}
        )

    assert cache.node_key("vocab", {}, {}, []) == bare("vocab")
    assert cache.node_key("pretrain", {}, {}, []) != bare("pretrain")  # revision 2: 659a990
    before = cache.node_key("finetune", {}, {}, [])
    assert before == bare("finetune")
    monkeypatch.setitem(cache.OUTPUT_REVISION, "finetune", 2)
    assert cache.node_key("finetune", {}, {}, []) != before
    # same config and inputs, another key: the plan says the code's revision may be why
    reason = cache.explain_change({"config": {}, "inputs": []}, {}, [])
    assert "output revision" in reason
