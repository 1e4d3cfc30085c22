"""pipelines/designs.yaml (issue 7): the design variants, their equal budget, and the long-document
readings of WCM-bo expand and plan against the real data directory."""

from __future__ import annotations

from pathlib import Path

from tibnlp.pipeline.grid import expand
from tibnlp.pipeline.planner import Planner
from tibnlp.pipeline.spec import load_pipeline

SPEC = Path(__file__).resolve().parents[1] / "pipelines" / "designs.yaml"


def test_designs_pipeline_expands_to_every_design_and_reading(
    corpus_dir: Path, tmp_path: Path
) -> None:
    spec = load_pipeline(SPEC, ["vars.budget_steps=7", "vars.mem_threshold=2.0"])
    nodes = expand(spec)
    planner = Planner(spec)
    pre = {
        n.variant: planner.config_dict(n, real=False) for n in nodes if n.stage.name == "pretrain"
    }
    assert set(pre) == {
        "base",
        "relative",
        "relative-recurrence",
        "rpsan-fusion",
        "memory-tokens",
        "dynamic-relative",
    }
    for name, cfg in pre.items():
        assert cfg["pretrain"]["max_steps"] == 7, name  # one budget for all models
    rec = pre["relative-recurrence"]
    assert rec["model"]["recurrence"]["mem_len"] > 0 and rec["model"]["position"] == "relative"
    # equal tokens per step: chains of `segments` windows, batch divided by as much
    tokens = {
        n: c["pretrain"]["batch_size"] * c["pretrain"]["recurrence_segments"]
        if c["model"]["recurrence"]["mem_len"]
        else c["pretrain"]["batch_size"]
        for n, c in pre.items()
    }
    assert len(set(tokens.values())) == 1, tokens
    assert pre["rpsan-fusion"]["model"]["fusion"]["enabled"]
    assert pre["memory-tokens"]["model"]["memory_tokens"] > 0
    dyn = pre["dynamic-relative"]["model"]
    assert dyn["heads"]["small"] < dyn["heads"]["large"] and dyn["position"] == "relative"

    wcm = [n for n in nodes if n.stage.name == "wcm"]
    readings = {planner.config_dict(n, real=False)["finetune"]["long_document"] for n in wcm}
    assert readings == {"truncate", "segments", "memory"} and len(wcm) == 3 * len(pre)
    assert {n.model_label for n in wcm} == set(pre)  # every row of `runs compare` is named
    ft = planner.config_dict(wcm[0], real=False)
    assert ft["finetune"]["dataset"] == "wcm_bo"
    assert ft["finetune"]["max_len"] < ft["finetune"]["document_max_len"]  # a real window
    assert ft["finetune"]["global_memory"]["threshold"] == 2.0
    tncc = [planner.config_dict(n, real=False) for n in nodes if n.stage.name == "tncc"]
    assert len(tncc) == len(pre) and {c["finetune"]["task"] for c in tncc} == {"title"}

    steps = Planner(spec, tmp_path / "work").plan()
    assert [s.action for s in steps] == ["run"] * len(steps)
    assert str(corpus_dir) not in SPEC.read_text()
