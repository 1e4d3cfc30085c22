"""Pipeline reruns as a user meets them: a dataset file read by name changed under a cached
fine-tuning stage, an extra test set asked of it, Ctrl-C in a stage, a corpus that is not UTF-8,
a dry run beside a run.

Small registered stages stand in for the real ones (no training); the real fine-tuning
stage's data hook and slicing adapter are used as they are."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tibnlp.config import Config
from tibnlp.errors import DataError
from tibnlp.folder_lock import hold_folder
from tibnlp.pipeline.context import StageContext
from tibnlp.pipeline.registry import register_stage, stage_def
from tibnlp.pipeline.runner import run_pipeline
from tibnlp.pipeline.spec import load_pipeline
from tibnlp.pipeline.stages import slice_corpus

CALLS: list[str] = []
INTERRUPT: set[str] = set()


def _text(ctx: StageContext) -> Path:
    CALLS.append(ctx.name + ("(resume)" if ctx.resume else ""))
    out = ctx.output / "text.txt"
    if ctx.name in INTERRUPT:
        out.write_text("half", encoding="utf-8")
        INTERRUPT.discard(ctx.name)
        raise KeyboardInterrupt
    out.write_text("ཀ་ཁ།\n", encoding="utf-8")
    return out


def _scores(ctx: StageContext) -> dict[str, float]:
    CALLS.append(ctx.name)
    return {"test_macro_f1": 0.5}


register_stage("qa_text", _text, ("pretrain",))
register_stage("qa_ft", _scores, ("finetune",), data=stage_def("finetune").data)

PIPELINE = """
name: qa
workdir: {workdir}
config:
  tracking: {{enabled: false}}
stages:
  text:
    kind: qa_text
  finetune:
    kind: qa_ft
    inputs: {{model: '${{stages.text.output}}'}}
"""


@pytest.fixture
def qa(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    tncc = tmp_path / "data" / "tncc"
    tncc.mkdir(parents=True)
    for split in ("train", "validation", "test"):
        row = {"text": "ཀ ཁ", "label": "Politics"}
        (tncc / f"tncc_title_{split}.jsonl").write_text(json.dumps(row) + "\n", encoding="utf-8")
    (tncc / "labels.json").write_text('["Politics"]', encoding="utf-8")
    monkeypatch.setenv("TIBNLP_DATA", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "qa.yaml"
    path.write_text(PIPELINE.format(workdir=tmp_path / "work"), encoding="utf-8")
    CALLS.clear()
    INTERRUPT.clear()
    return path


def _plan(path: Path) -> dict[str, str]:
    lines: list[str] = []
    run_pipeline(load_pipeline(path), dry_run=True, echo=lines.append)
    return {ln.split()[1]: ln for ln in lines[1:] if not ln.strip().startswith("note:")}


def test_a_changed_dataset_file_reruns_the_cached_finetune_stage(qa: Path) -> None:
    run_pipeline(load_pipeline(qa), echo=lambda _: None)
    assert _plan(qa)["finetune"].split()[0] == "skip"
    train = Path(qa.parent / "data" / "tncc" / "tncc_title_train.jsonl")
    train.write_text(json.dumps({"text": "ག ང", "label": "Politics"}) + "\n", encoding="utf-8")
    line = _plan(qa)["finetune"]
    assert line.split()[0] == "run" and "tncc/tncc_title_train.jsonl" in line
    assert _plan(qa)["text"].split()[0] == "skip"  # upstream of it: untouched
    CALLS.clear()
    run_pipeline(load_pipeline(qa), echo=lambda _: None)
    assert CALLS == ["finetune"]
    assert _plan(qa)["finetune"].split()[0] == "skip"


def test_ctrl_c_in_a_stage_says_what_stays_and_the_rerun_continues(qa: Path) -> None:
    INTERRUPT.add("text")
    lines: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(load_pipeline(qa), echo=lines.append)
    said = [ln for ln in lines if ln.startswith("interrupted in stage text")]
    assert said and ".partial" in said[0] and "run the same command again" in said[0]
    assert "resume the interrupted run" in _plan(qa)["text"]  # half-written: not taken as done
    CALLS.clear()
    run_pipeline(load_pipeline(qa), echo=lambda _: None)
    assert CALLS == ["text(resume)", "finetune"]


def test_a_corpus_that_is_not_utf8_is_named_not_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "cut.txt"
    bad.write_bytes("ཀ་ཁ།".encode()[:-1])  # cut inside a character
    out = tmp_path / "out"
    out.mkdir()
    ctx = StageContext("slice", "slice", "", Config(), [bad], out, False, None)  # type: ignore[arg-type]
    with pytest.raises(DataError, match=r"cut\.txt is not UTF-8"):
        slice_corpus(ctx)


def test_a_dry_run_beside_a_running_pipeline_says_who_holds_the_work_dir(qa: Path) -> None:
    lines: list[str] = []
    with hold_folder(qa.parent / "work"):
        run_pipeline(load_pipeline(qa), dry_run=True, echo=lines.append)
    assert any("in use by process" in ln and "not an interrupted one" in ln for ln in lines)
    lines.clear()
    run_pipeline(load_pipeline(qa), dry_run=True, echo=lines.append)  # free: no note
    assert not any("in use by" in ln for ln in lines)


def _scores_once(ctx: StageContext) -> dict[str, float]:
    """Trains when its output holds no classifier yet; else only scores the asked sets."""
    trained = ctx.output / "finetune" / "classifier.txt"
    sets = ctx.config.finetune.eval_also
    CALLS.append(f"score {','.join(sets)}" if trained.exists() else "train")
    if ctx.name in INTERRUPT:
        INTERRUPT.discard(ctx.name)
        raise KeyboardInterrupt
    trained.parent.mkdir(exist_ok=True)
    trained.write_text("weights", encoding="utf-8")
    return {"test_macro_f1": 0.5, **{f"{name}_macro_f1": 0.4 for name in sets}}


def _register_scores_once(kind: str, rescored: bool = True) -> None:
    """`_scores_once` as a fine-tuning stage, its extra sets out of its key or (as before
    834d4ab) in it."""
    real = stage_def("finetune")
    register_stage(
        kind,
        _scores_once,
        ("finetune",),
        data=real.data,
        rescored=real.rescored if rescored else (),
    )


_register_scores_once("qa_ft_sets")


def test_eval_also_added_rescores_the_cached_finetune_stage_and_removed_keeps_it(
    qa: Path,
) -> None:
    """`finetune.eval_also` was in the stage's key: asking for advts retrained every seed
    (and dropping it again did too), though a seed is scored on it from its saved
    classifier. Now adding it reruns the stage on its output, to score advts only."""
    plain = qa.read_text(encoding="utf-8").replace("kind: qa_ft", "kind: qa_ft_sets")
    qa.write_text(plain, encoding="utf-8")
    run_pipeline(load_pipeline(qa), echo=lambda _: None)
    assert CALLS == ["text", "train"]
    with_advts = plain + "    config: {finetune: {eval_also: [advts]}}\n"
    qa.write_text(with_advts, encoding="utf-8")
    line = _plan(qa)["finetune"]
    assert line.split()[0] == "run" and "rescore only: finetune.eval_also=advts" in line
    CALLS.clear()
    result = run_pipeline(load_pipeline(qa), echo=lambda _: None)
    assert CALLS == ["score advts"]
    assert result.results["finetune"]["advts_macro_f1"] == 0.4
    assert _plan(qa)["finetune"].split()[0] == "skip"
    qa.write_text(plain, encoding="utf-8")  # dropped: the output holds more, still up to date
    assert _plan(qa)["finetune"].split()[0] == "skip"
    CALLS.clear()
    result = run_pipeline(load_pipeline(qa), echo=lambda _: None)
    assert CALLS == [] and result.results["finetune"]["advts_macro_f1"] == 0.4


def test_a_stage_cached_while_eval_also_was_in_its_key_is_found_not_trained_again(
    qa: Path,
) -> None:
    """Outputs published while `finetune.eval_also` was in the stage's key (before 834d4ab)
    are found under that key: without it, upgrading retrained every seed of each such stage
    (quickstart's fine-tunings all ask for advts) and ran every stage after it again."""
    _register_scores_once("qa_ft_before", rescored=False)
    text = qa.read_text(encoding="utf-8").replace("kind: qa_ft", "kind: qa_ft_before")
    qa.write_text(text + "    config: {finetune: {eval_also: [advts]}}\n", encoding="utf-8")
    run_pipeline(load_pipeline(qa), echo=lambda _: None)  # the stage as it was: sets in its key
    assert CALLS == ["text", "train"]
    _register_scores_once("qa_ft_before")
    assert _plan(qa)["finetune"].split()[0] == "skip", _plan(qa)["finetune"]
    CALLS.clear()
    result = run_pipeline(load_pipeline(qa), echo=lambda _: None)
    assert CALLS == [] and result.results["finetune"]["advts_macro_f1"] == 0.4
    qa.write_text(text, encoding="utf-8")  # without the set: its old key held none, run once
    assert _plan(qa)["finetune"].split()[0] == "run"


def _copy_cut_short(src: str, dst: str) -> None:
    """A copy Ctrl-C stops mid-write: half the file, then KeyboardInterrupt."""
    data = Path(src).read_bytes()
    Path(dst).write_bytes(data[: len(data) // 2])
    raise KeyboardInterrupt


def test_a_rescore_copy_cut_short_leaves_no_partial_and_the_rerun_copies_again(
    qa: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The published output was copied straight into the partial folder and the run file
    written after: a copy cut short left a half copy the rerun resumed, retraining the seeds
    not copied and reading a classifier cut mid-write."""
    plain = qa.read_text(encoding="utf-8").replace("kind: qa_ft", "kind: qa_ft_sets")
    qa.write_text(plain + "    config: {finetune: {eval_also: [advts]}}\n", encoding="utf-8")
    qa.with_suffix(".plain").write_text(plain, encoding="utf-8")
    run_pipeline(load_pipeline(qa.with_suffix(".plain")), echo=lambda _: None)
    real = shutil.copytree

    def cut(src: Path, dst: Path, *args: Any, **kwargs: Any) -> Any:
        if not args:  # the outer call; a subfolder's passes it on by position
            kwargs["copy_function"] = _copy_cut_short
        return real(src, dst, *args, **kwargs)

    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(shutil, "copytree", cut)
        run_pipeline(load_pipeline(qa), echo=lambda _: None)
    assert not list((qa.parent / "work").rglob("*partial*"))  # nor its temporary copy
    line = _plan(qa)["finetune"]
    assert "rescore only: finetune.eval_also=advts newly asked" in line and "resume" not in line
    CALLS.clear()
    run_pipeline(load_pipeline(qa), echo=lambda _: None)
    assert CALLS == ["score advts"]


def test_a_rescore_cut_short_says_the_rerun_resumes_it(qa: Path) -> None:
    """The plan said only "rescore only: ... newly asked" though the run went on from the
    interrupted one's partial folder (training any seed missing there)."""
    plain = qa.read_text(encoding="utf-8").replace("kind: qa_ft", "kind: qa_ft_sets")
    qa.write_text(plain, encoding="utf-8")
    run_pipeline(load_pipeline(qa), echo=lambda _: None)
    qa.write_text(plain + "    config: {finetune: {eval_also: [advts]}}\n", encoding="utf-8")
    INTERRUPT.add("finetune")
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(load_pipeline(qa), echo=lambda _: None)
    line = _plan(qa)["finetune"]
    assert "rescore only: finetune.eval_also=advts newly asked (resume the interrupted run" in line
    CALLS.clear()
    run_pipeline(load_pipeline(qa), echo=lambda _: None)
    assert CALLS == ["score advts"]
