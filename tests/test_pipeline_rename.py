"""A stage's key does not hold its variant's name: renaming a variant, or removing a grid down
to the value it ran with, finds the cached output instead of running the stage again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tibnlp.pipeline.context import StageContext
from tibnlp.pipeline.planner import Planner
from tibnlp.pipeline.registry import register_stage
from tibnlp.pipeline.runner import run_pipeline
from tibnlp.pipeline.spec import load_pipeline

RUNS: list[str] = []


def count_runs(ctx: StageContext) -> dict[str, Any]:
    RUNS.append(ctx.output.name)
    (ctx.output / "out.txt").write_text("made", encoding="utf-8")
    return {"n": 1}


register_stage("rn_count", count_runs, ("finetune",))


def _write(path: Path, stage: dict[str, Any]) -> Path:
    body = {
        "name": "rename",
        "workdir": str(path.parent / "work"),
        "config": {"tracking": {"enabled": False}},
        "stages": {"s": {"kind": "rn_count", **stage}},
    }
    path.write_text(yaml.safe_dump(body, sort_keys=False), encoding="utf-8")
    return path


def _quiet(_: str) -> None:
    pass


def test_a_renamed_variant_reuses_its_output(tmp_path: Path) -> None:
    RUNS.clear()
    path = tmp_path / "p.yaml"
    _write(path, {"variants": [{"name": "old", "set": {"finetune.epochs": 2}}]})
    run_pipeline(load_pipeline(path), echo=_quiet)
    assert len(RUNS) == 1
    _write(path, {"variants": [{"name": "new", "set": {"finetune.epochs": 2}}]})
    step = Planner(load_pipeline(path)).plan()[0]
    # before: "run" (no output yet), the stage trained again under the new folder name
    assert step.action == "skip" and "cached under another name" in step.reason
    assert step.slot.final.name.startswith("old-")
    result = run_pipeline(load_pipeline(path), echo=_quiet)
    assert len(RUNS) == 1
    assert (result.outputs["s[new]"] / "out.txt").read_text(encoding="utf-8") == "made"


def test_a_grid_removed_down_to_its_value_reuses_its_output(tmp_path: Path) -> None:
    RUNS.clear()
    path = tmp_path / "p.yaml"
    _write(path, {"grid": {"finetune.epochs": [2]}})
    run_pipeline(load_pipeline(path), echo=_quiet)
    _write(path, {"config": {"finetune": {"epochs": 2}}})
    assert Planner(load_pipeline(path)).plan()[0].action == "skip"
    run_pipeline(load_pipeline(path), echo=_quiet)
    assert len(RUNS) == 1


def test_other_settings_still_run(tmp_path: Path) -> None:
    RUNS.clear()
    path = tmp_path / "p.yaml"
    _write(path, {"variants": [{"name": "old", "set": {"finetune.epochs": 2}}]})
    run_pipeline(load_pipeline(path), echo=_quiet)
    _write(path, {"variants": [{"name": "new", "set": {"finetune.epochs": 3}}]})
    assert Planner(load_pipeline(path)).plan()[0].action == "run"
    run_pipeline(load_pipeline(path), echo=_quiet)
    assert len(RUNS) == 2
