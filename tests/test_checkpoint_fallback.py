"""`--resume` promises the newest *complete* checkpoint: one whose files were damaged since
it was marked is passed over, with a warning, for the older one; an unsafe one is not."""

from __future__ import annotations

import json
from pathlib import Path

import engine_harness as h
import pytest

from tibnlp.errors import TibnlpError
from tibnlp.training import checkpoint

MODEL_FILE = "mp_rank_00_model_states.pt"


def _two_checkpoints(tmp_path: Path) -> Path:
    out = tmp_path / "run"
    h.main(out, {"max_steps": 4, "checkpoint_every": 2, "eval_every": 100})
    assert checkpoint.complete_tags(out / "checkpoints") == ["step00000004", "step00000002"]
    return out


def test_resume_passes_over_a_damaged_newest_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _two_checkpoints(tmp_path)
    newest = out / "checkpoints" / "step00000004" / MODEL_FILE
    newest.write_bytes(newest.read_bytes()[:100])  # cut short: was a traceback-free refusal
    h.main(out, {"max_steps": 5, "checkpoint_every": 100, "eval_every": 100, "resume": True})
    assert json.loads((out / "result.json").read_text())["step"] == 5
    err = capsys.readouterr().err
    assert "step00000004" in err and "resuming from the older step00000002" in err


def test_resume_with_every_checkpoint_damaged_names_the_file(tmp_path: Path) -> None:
    out = _two_checkpoints(tmp_path)
    for tag in ("step00000004", "step00000002"):
        path = out / "checkpoints" / tag / MODEL_FILE
        path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(TibnlpError, match=rf"step00000002/{MODEL_FILE}"):
        h.main(out, {"max_steps": 5, "resume": True})


def test_a_partial_folder_newer_than_the_marker_is_not_complete(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoints"
    for step in (2, 4, 6):
        (ckpt / checkpoint.tag_for(step)).mkdir(parents=True)
    (ckpt / checkpoint.MARKER).write_text("step00000004\n")
    assert checkpoint.complete_tags(ckpt) == ["step00000004", "step00000002"]
    assert checkpoint.complete_tags(tmp_path / "none") == []
