"""Pipeline mechanisms behind the learning curve, pinned with small registered stages: a grid
over a stage's params (each value its own node, cached on its own), a `collect` stage that
reads every variant above it as one node, and the summary a pipeline ends with (printed, the
parent run's description; the experiment described)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tibnlp.pipeline.context import StageContext
from tibnlp.pipeline.grid import expand
from tibnlp.pipeline.registry import register_stage
from tibnlp.pipeline.runner import run_pipeline
from tibnlp.pipeline.spec import load_pipeline
from tibnlp.tracking.testing import sqlite_store

CALLS: list[str] = []


def export(ctx: StageContext) -> Path:
    """Stands for pretraining: a model directory and exports at the listed token counts."""
    CALLS.append(ctx.name)
    for tokens in ctx.config.pretrain.export_at_tokens:
        (ctx.output / "exports" / f"tokens-{int(tokens)}").mkdir(parents=True)
    (ctx.output / "model").mkdir()
    return ctx.output / "model"


def score(ctx: StageContext) -> dict[str, object]:
    """Stands for fine-tuning: a score from the export chosen by the param."""
    CALLS.append(ctx.name)
    model = Path(ctx.inputs["model"])  # type: ignore[index]
    tokens = ctx.params.get("export_tokens")
    if tokens is not None:
        assert (model.parent / "exports" / f"tokens-{int(tokens)}").is_dir()
    value = 0.3 + (float(tokens) / 1e4 if tokens is not None else 0.0)
    (ctx.output / "score.json").write_text(json.dumps({"f1": value}))
    return {"test_macro_f1": value}


def table(ctx: StageContext) -> tuple[Path, dict[str, object]]:
    """Stands for the curve: reads every output above it."""
    CALLS.append(ctx.name)
    dirs = list(ctx.inputs)
    scores = sorted(json.loads((Path(d) / "score.json").read_text())["f1"] for d in dirs)
    out = ctx.output / "table.md"
    text = "| f1 |\n|---|\n" + "".join(f"| {s:.2f} |\n" for s in scores)
    out.write_text(text)
    return out, {"summary": text, "rows": len(scores)}


register_stage("c_export", export, ("pretrain",))
register_stage("c_score", score, ("finetune",))
register_stage("c_table", table, ())

PIPELINE = """
name: collect
experiment: collect-exp
workdir: {workdir}
description: toy curve
vars: {{exports: [1000, 2000, 4000]}}
config:
  tracking: {{uri: "{uri}"}}
  pretrain: {{export_at_tokens: [1000, 2000, 4000, 8000]}}
stages:
  pretrain:
    kind: c_export
  finetune:
    kind: c_score
    inputs: {{model: "${{stages.pretrain.output}}"}}
    grid: {{params.export_tokens: "${{vars.exports}}"}}
  baselines:
    kind: c_score
    inputs: {{model: "${{stages.pretrain.output}}"}}
    variants: [{{name: random, set: {{finetune.init: random}}}}]
  curve:
    kind: c_table
    collect: true
    description: the table
    inputs: ["${{stages.finetune.output}}", "${{stages.baselines.output}}"]
"""


@pytest.fixture
def spec_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    monkeypatch.chdir(tmp_path)
    uri = sqlite_store(tmp_path)
    path = tmp_path / "collect.yaml"
    path.write_text(PIPELINE.format(workdir=tmp_path / "work", uri=uri), encoding="utf-8")
    CALLS.clear()
    return path, uri


def test_params_grid_and_collect_expand(spec_path: tuple[Path, str]) -> None:
    nodes = expand(load_pipeline(spec_path[0]))
    names = [n.name for n in nodes]
    assert names == [
        "pretrain",
        "finetune[export_tokens=1000]",
        "finetune[export_tokens=2000]",
        "finetune[export_tokens=4000]",
        "baselines[random]",
        "curve",  # one node, not one per variant above it
    ]
    assert [len(v) for v in nodes[-1].collected.values()] == [3, 1]


def test_collect_reads_every_variant_and_the_pipeline_ends_with_its_summary(
    spec_path: tuple[Path, str],
) -> None:
    path, uri = spec_path
    lines: list[str] = []
    first = run_pipeline(load_pipeline(path), echo=lines.append)
    assert CALLS[-1] == "curve" and len(first.ran) == 6
    assert first.results["curve"]["rows"] == 4
    printed = "\n".join(lines)
    assert "| 0.30 |\n| 0.40 |\n| 0.50 |\n| 0.70 |" in printed
    assert f"curve: {first.outputs['curve']}" in printed  # where the output is
    assert first.outputs["curve"].name == "table.md" and first.outputs["curve"].is_file()
    client = MlflowClient(uri)
    parent = client.get_run(first.run_id)
    assert "| 0.70 |" in parent.data.tags["mlflow.note.content"]
    about = client.get_experiment_by_name("collect-exp").tags["mlflow.note.content"]
    assert about.startswith("toy curve (collect.yaml)")
    assert "- curve (c_table, over every variant above): the table" in about
    assert "- finetune (c_score, 3 variants)" in about

    # everything cached: nothing runs, the summary is shown all the same
    CALLS.clear()
    lines.clear()
    run_pipeline(load_pipeline(path), echo=lines.append)
    assert CALLS == [] and "| 0.70 |" in "\n".join(lines)

    # one more point: only it and the curve run; the other points are cached on their own
    CALLS.clear()
    again = run_pipeline(load_pipeline(path, ["vars.exports=[1000,2000,4000,8000]"]), echo=print)
    assert sorted(again.ran) == ["curve", "finetune[export_tokens=8000]"]
    assert again.results["curve"]["rows"] == 5
