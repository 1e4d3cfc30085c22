"""`--resume` promises the newest *complete* checkpoint: one whose files were damaged since
it was marked is passed over, with a warning, for the older one; an unsafe one is not."""

from __future__ import annotations

import json
from pathlib import Path

import engine_harness as h
import pytest
import torch

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


TWO_RANKS = {
    "max_steps": 4,
    "batch_size": 8,
    "micro_batch_size": 4,
    "checkpoint_every": 2,
    "eval_every": 100,
    "dropout": 0.0,
    "zero_stage": 2,  # one optimizer shard per rank: rank 1's is read by rank 1 alone
}
RANK1_SHARD = "zero_pp_rank_1_mp_rank_00_optim_states.pt"


def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:100])


@pytest.mark.slow
def test_two_ranks_pass_over_a_shard_only_one_of_them_reads(tmp_path: Path) -> None:
    """Rank 0 reads the newest checkpoint fine, rank 1 cannot: both move on to the older one
    together (or their collectives would no longer pair up), with rank 1's reason, said once,
    and continue exactly as a resume from that older checkpoint does."""
    import shutil

    done = h.torchrun(tmp_path / "a" / "run", TWO_RANKS)
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("damaged", "older", "all_damaged"):
        shutil.copytree(tmp_path / "a", tmp_path / name)
    _cut(tmp_path / "damaged/run/checkpoints/step00000004" / RANK1_SHARD)
    older = tmp_path / "older/run/checkpoints"
    shutil.rmtree(older / "step00000004")
    (older / checkpoint.MARKER).write_text("step00000002\n")

    resume = {**TWO_RANKS, "max_steps": 5, "checkpoint_every": 100, "resume": True}
    damaged = h.torchrun(tmp_path / "damaged" / "run", resume)
    assert damaged.returncode == 0, damaged.stderr[-3000:]
    warnings = [line for line in damaged.stderr.splitlines() if "cannot be read" in line]
    assert len(warnings) == 1, damaged.stderr[-3000:]
    assert "(rank 1)" in warnings[0] and RANK1_SHARD in warnings[0]
    assert "resuming from the older step00000002" in warnings[0]
    assert h.torchrun(tmp_path / "older" / "run", resume).returncode == 0
    got = torch.load(tmp_path / "damaged/run/weights.pt", weights_only=True)
    want = torch.load(tmp_path / "older/run/weights.pt", weights_only=True)
    assert json.loads((tmp_path / "damaged/run/result.json").read_text())["step"] == 5
    for key in want:
        assert torch.equal(got[key], want[key]), key

    # every checkpoint unreadable by rank 1 alone: both ranks stop with rank 1's reason
    for tag in ("step00000004", "step00000002"):
        _cut(tmp_path / "all_damaged/run/checkpoints" / tag / RANK1_SHARD)
    failed = h.torchrun(tmp_path / "all_damaged" / "run", resume)
    assert failed.returncode != 0
    out = failed.stdout + failed.stderr
    assert out.count("fails (rank 1)") >= 2 and f"step00000002/{RANK1_SHARD}" in out, out[-3000:]
