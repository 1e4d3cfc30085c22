"""The result and record files a fine-tuning (and a pipeline stage) writes are standard JSON:
a score not known (a flip rate with no text read: NaN) is null, and read back as NaN."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.ft_fixtures import make_data_dir, make_vocab, tiny_textcnn
from tibnlp.config import Config, load_config
from tibnlp.evaluation.report import markdown_table
from tibnlp.evaluation.result_loader import load_results
from tibnlp.pipeline import cache
from tibnlp.pipeline.context import StageContext
from tibnlp.pipeline.planner import Planner
from tibnlp.pipeline.registry import register_stage
from tibnlp.pipeline.runner import run_pipeline
from tibnlp.pipeline.spec import load_pipeline
from tibnlp.training import finetune_seeds as seeds_mod
from tibnlp.training.finetune import FinetuneResult, run_finetune


def strict_json(path: Path) -> Any:
    """`path` read as jq or JSON.parse would: a bare NaN or Infinity is refused."""

    def refuse(name: str) -> None:
        raise ValueError(f"{path}: {name} is not JSON")

    return json.loads(path.read_text("utf-8"), parse_constant=refuse)


def _cut_config(tmp: Path, mp: pytest.MonkeyPatch) -> Config:
    """A tiny TextCNN reading 4 pieces: no test title is read with its shad (rate: NaN); the
    data directory (TIBNLP_DATA, set by `mp`) and vocabulary under `tmp`."""
    mp.setenv("TIBNLP_DATA", str(make_data_dir(tmp / "data", (30, 12, 12))))
    flags = ["finetune.max_len=4", "finetune.text_form=tsheg", "finetune.batch_size=8"]
    return load_config(None, tiny_textcnn(make_vocab(tmp / "vocab"), tmp / "runs", *flags))


@pytest.fixture(scope="module")
def every_suffix_cut(tmp_path_factory) -> FinetuneResult:
    with pytest.MonkeyPatch.context() as mp:
        return run_finetune(_cut_config(tmp_path_factory.mktemp("cut"), mp), "tncc")


def test_a_flip_rate_of_no_text_read_is_null_in_results_json(every_suffix_cut) -> None:
    result = every_suffix_cut
    assert math.isnan(result.seeds[0].metrics["test"]["shad_flip_rate"])
    path = result.output / "results.json"
    written = strict_json(path)
    assert written["aggregate"]["test"]["shad_flip_rate"] == {"mean": None, "std": None}
    assert written["seeds"][0]["metrics"]["test"]["shad_flip_rate"] is None
    (row,) = load_results([path])  # read back: not known, as it was meant
    assert math.isnan(row["aggregate"]["test"]["shad_flip_rate"]["mean"])
    assert math.isnan(row["seeds"][0]["metrics"]["test"]["shad_flip_rate"])
    assert row["seeds"][0]["metrics"]["test"]["shad_flip_excluded"] == 12
    shad = markdown_table([row]).splitlines()[2].split(" | ")[6]  # the "shad flips" cell
    assert shad == "-"


def test_a_flip_rate_of_no_text_read_is_null_in_the_seed_record(every_suffix_cut) -> None:
    directory = every_suffix_cut.seeds[0].directory
    record = strict_json(directory / seeds_mod.SEED_FILE)
    assert record["metrics"]["test"]["summary"]["shad_flip_rate"] is None
    done = seeds_mod.load_seed(directory, record["fingerprint"], record["pretrained_sha256"])
    assert done is not None  # a rerun reports it: not known, not a damaged record
    assert math.isnan(done.metrics["test"]["shad_flip_rate"])
    assert done.metrics["test"]["accuracy"] == every_suffix_cut.seeds[0].metrics["test"]["accuracy"]


def _unknown_score(ctx: StageContext) -> dict[str, Any]:
    return {"test_shad_flip_rate": math.nan, "loss": math.inf, "test_macro_f1": 0.5}


register_stage("r_unknown_score", _unknown_score, ("finetune",))


def test_a_pipeline_stage_result_holding_nan_is_standard_json(tmp_path: Path) -> None:
    """A stage's results.json and its output's manifest hold its result: null, not NaN."""
    path = tmp_path / "nan.yaml"
    body = {
        "name": "nan",
        "workdir": str(tmp_path / "work"),
        "config": {"tracking": {"enabled": False}},
        "stages": {"r": {"kind": "r_unknown_score"}},
    }
    path.write_text(yaml.safe_dump(body), encoding="utf-8")
    run_pipeline(load_pipeline(path), echo=lambda _: None)
    final = Planner(load_pipeline(path)).plan()[0].slot.final
    result = strict_json(final / "results.json")
    assert result == {"test_shad_flip_rate": None, "loss": None, "test_macro_f1": 0.5}
    assert strict_json(final / cache.MANIFEST)["result"] == result


def test_a_record_from_before_cut_texts_were_left_out_is_rescored(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """A seed record without `*_flip_excluded` holds a flip rate that counted the cut texts as
    not flipped: a rerun scores its rates again from the saved classifier and rewrites the
    record, rather than averaging the old measure with new seeds' (or training it again)."""
    cfg = _cut_config(tmp_path, monkeypatch)
    seed = run_finetune(cfg, "tncc").seeds[0]
    path, weights = seed.directory / seeds_mod.SEED_FILE, seed.directory / "model.safetensors"
    stamp, new = weights.stat().st_mtime_ns, path.read_text("utf-8")
    old = json.loads(new)
    for name in ("shad", "tsheg"):  # as versions before the exclusion wrote it
        del old["metrics"]["test"]["summary"][f"{name}_flip_excluded"]
        old["metrics"]["test"]["summary"][f"{name}_flip_rate"] = 0.0
    path.write_text(json.dumps(old), "utf-8")
    capsys.readouterr()
    again = run_finetune(cfg, "tncc")
    assert weights.stat().st_mtime_ns == stamp  # scored again, not trained
    assert math.isnan(again.seeds[0].metrics["test"]["shad_flip_rate"])
    assert math.isnan(again.aggregate["test"]["shad_flip_rate"][0])  # not the old 0.0
    assert again.seeds[0].metrics["test"]["shad_flip_excluded"] == 12
    record = strict_json(path)
    assert record["metrics"]["test"]["summary"]["tsheg_flip_excluded"] == 12
    assert record["metrics"]["test"]["summary"]["shad_flip_rate"] is None
    assert "flip rates scored again" in capsys.readouterr().err
