"""`tibnlp pipeline clean`: the outputs a pipeline's current plan does not use are listed, and
removed with --yes; what the plan uses, and folders the pipeline did not make, stay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from tibnlp.cli.main import app
from tibnlp.folder_lock import FolderBusy, hold_folder
from tibnlp.pipeline.context import StageContext
from tibnlp.pipeline.planner import Planner
from tibnlp.pipeline.registry import register_stage
from tibnlp.pipeline.runner import run_pipeline
from tibnlp.pipeline.spec import load_pipeline


def write_output(ctx: StageContext) -> dict[str, Any]:
    (ctx.output / "weights.bin").write_bytes(b"x" * 4096)
    return {"n": 1}


register_stage("cl_write", write_output, ("finetune",))


def _pipeline(path: Path, epochs: int) -> Path:
    body = {
        "name": "clean",
        "workdir": str(path.parent / "work"),
        "config": {"tracking": {"enabled": False}, "finetune": {"epochs": epochs}},
        "stages": {"s": {"kind": "cl_write"}},
    }
    path.write_text(yaml.safe_dump(body, sort_keys=False), encoding="utf-8")
    return path


def _quiet(_: str) -> None:
    pass


def _clean(path: Path, *extra: str) -> str:
    result = CliRunner().invoke(app, ["pipeline", "clean", str(path), *extra])
    assert result.exit_code == 0, (result.output, result.exception)
    return " ".join(result.output.split())


def test_outputs_of_other_settings_are_listed_then_removed(tmp_path: Path) -> None:
    path = _pipeline(tmp_path / "p.yaml", 2)
    run_pipeline(load_pipeline(path), echo=_quiet)
    old = next((tmp_path / "work" / "s").glob("out-*"))
    _pipeline(path, 3)
    run_pipeline(load_pipeline(path), echo=_quiet)
    current = Planner(load_pipeline(path)).plan()[0].slot.final
    assert current != old and current.is_dir()
    # a folder the pipeline did not make, and one of a stage the file no longer has
    (tmp_path / "work" / "s" / "notes").mkdir()
    (tmp_path / "work" / "gone" / "out-0123456789ab").mkdir(parents=True)

    said = _clean(path)
    assert f"{old} (output of other settings: config changed: finetune.epochs: 2 -> 3)" in said
    assert "1 folder(s)" in said
    assert str(current) not in said and "notes" not in said and "gone" not in said
    assert old.is_dir()  # listed only

    said = _clean(path, "--yes")
    assert "removed 1 folder(s)" in said
    assert not old.exists() and current.is_dir() and (tmp_path / "work" / "s" / "notes").is_dir()
    assert (tmp_path / "work" / "gone" / "out-0123456789ab").is_dir()
    assert Planner(load_pipeline(path)).plan()[0].action == "skip"  # still cached
    assert "every stage output is in the current plan" in _clean(path)


def test_an_abandoned_partial_goes_and_a_resumable_one_stays(tmp_path: Path) -> None:
    path = _pipeline(tmp_path / "p.yaml", 2)
    step = Planner(load_pipeline(path)).plan()[0]
    step.slot.partial.mkdir(parents=True)  # interrupted with these settings: it will resume
    abandoned = step.slot.partial.with_name("out-abcdefabcdef.partial")
    abandoned.mkdir()
    said = _clean(path, "--yes")
    assert "interrupted run" in said and not abandoned.exists() and step.slot.partial.is_dir()


def test_clean_waits_for_no_one_while_a_run_holds_the_work_dir(tmp_path: Path) -> None:
    path = _pipeline(tmp_path / "p.yaml", 2)
    run_pipeline(load_pipeline(path), echo=_quiet)
    with hold_folder(tmp_path / "work"):
        result = CliRunner().invoke(app, ["pipeline", "clean", str(path), "--yes"])
    assert isinstance(result.exception, FolderBusy)


def test_no_work_dir_is_nothing_to_clean(tmp_path: Path) -> None:
    assert "nothing to clean" in _clean(_pipeline(tmp_path / "p.yaml", 2))
    assert not (tmp_path / "work").exists()


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def test_an_output_of_the_same_settings_under_older_keys_is_named_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tibnlp.pipeline import cache

    path = _pipeline(tmp_path / "p.yaml", 2)
    run_pipeline(load_pipeline(path), echo=_quiet)
    monkeypatch.setitem(cache.OUTPUT_REVISION, "cl_write", 2)  # what an upgrade may do
    said = _clean(path)
    assert "(same settings, made by another tibnlp version (its keys changed))" in said


def test_clean_looks_only_inside_the_work_dir(tmp_path: Path) -> None:
    """A stage whose folder is not one of the work dir's (a stage named '..', refused when the
    file loads now) had clean list, and --yes remove, folders beside the work dir."""
    from tibnlp.pipeline.clean import unused_outputs

    spec = load_pipeline(_pipeline(tmp_path / "p.yaml", 2))
    spec.stages[0].name = ".."
    mine = tmp_path / "mydata-0123456789ab.partial"
    mine.mkdir()
    (tmp_path / "work").mkdir()
    assert unused_outputs(Planner(spec)) == []
    assert mine.is_dir()
