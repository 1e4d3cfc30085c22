"""The shipped pipelines parse, validate and plan against the real data directory; the slice
stage takes a reproducible slice of a real corpus."""

from __future__ import annotations

from pathlib import Path

import pytest

from tibnlp.errors import ConfigError
from tibnlp.pipeline.grid import expand
from tibnlp.pipeline.planner import Planner
from tibnlp.pipeline.spec import load_pipeline
from tibnlp.pipeline.stages import slice_corpus

PIPELINES = Path(__file__).resolve().parents[1] / "pipelines"


@pytest.mark.parametrize(
    "name", ["smoke", "quickstart", "dma_grid", "paper_tiny", "vectors_proxy", "gpu_wide"]
)
def test_shipped_pipeline_plans(name: str, corpus_dir: Path, tmp_path: Path) -> None:
    spec = load_pipeline(PIPELINES / f"{name}.yaml")
    steps = Planner(spec, tmp_path / "work").plan()
    assert [s.action for s in steps] == ["run"] * len(steps)
    assert steps[0].reason == "no output yet"
    kinds = [s.node.stage.kind for s in steps]
    assert {"prepare", "vocab", "pretrain", "finetune"} <= set(kinds)
    assert str(corpus_dir) not in (PIPELINES / f"{name}.yaml").read_text()


def test_gpu_wide_is_the_main_job_at_the_papers_width(corpus_dir: Path) -> None:
    """gpu_wide.yaml changes width, corpus, vocabulary, batch and precision; the rest of the
    main job's recipe (the thing its result is compared with) is the same."""

    def configs(name: str) -> dict[str, dict]:
        spec = load_pipeline(PIPELINES / f"{name}.yaml")
        planner = Planner(spec)
        return {n.stage.name: planner.config_dict(n, real=False) for n in expand(spec)}

    main, wide = configs("quickstart"), configs("gpu_wide")
    assert set(wide) == set(main) - {"vectors"}
    changed = {"hidden_size", "ffn_size", "heads"}
    m, w = main["pretrain"]["model"], wide["pretrain"]["model"]
    assert {k for k in m if m[k] != w[k]} == changed
    assert (w["hidden_size"], w["ffn_size"], w["heads"]["small"]) == (384, 1536, 12)
    a, b = main["pretrain"]["pretrain"], wide["pretrain"]["pretrain"]
    for key in ("seq_len", "mask_prob", "sop"):
        assert a[key] == b[key], key
    warm = [c["optimizer"]["warmup_steps"] / c["max_steps"] for c in (a, b)]
    assert warm[0] == warm[1] and a["optimizer"]["schedule"] == b["optimizer"]["schedule"]
    for stage in ("finetune", "twin"):
        a, b = main[stage]["finetune"], wide[stage]["finetune"]
        recipe = ("head", "layers", "epochs", "patience", "seeds", "optimizer", "init", "task")
        assert {k: a[k] for k in recipe} == {k: b[k] for k in recipe}, stage
    assert wide["vocab"]["vocab"]["vocab_size"] == 30000
    assert len(load_pipeline(PIPELINES / "gpu_wide.yaml").vars["corpora"]) == 9


def test_dma_grid_is_the_papers_ten_models_plus_multiscale(corpus_dir: Path) -> None:
    spec = load_pipeline(PIPELINES / "dma_grid.yaml", ["vars.budget_steps=7"])
    nodes = expand(spec)
    pre = [n for n in nodes if n.stage.name == "pretrain"]
    heads = {(n.overrides["model.heads.small"], n.overrides["model.heads.large"]) for n in pre}
    fixed = {(h, h) for h in (6, 8, 12, 16)}
    dynamic = {(a, b) for a in (6, 8, 12, 16) for b in (6, 8, 12, 16) if a < b}
    assert fixed | dynamic <= heads and len(fixed | dynamic) == 10
    alphas = sorted(n.overrides.get("model.scales.alpha", -1) for n in pre)
    assert alphas[-3:] == [0.0, 0.5, 1.0] and len(pre) == 13
    ft = [n for n in nodes if n.stage.name == "finetune"]
    assert len(ft) == 26
    assert {n.model_label for n in ft} == {n.variant for n in pre}
    planner = Planner(spec)
    cfg = planner.config_dict(pre[0], real=False)
    assert cfg["pretrain"]["max_steps"] == 7  # the budget is one parameter for all models
    assert {planner.config_dict(n, real=False)["finetune"]["task"] for n in ft} == {"title"}
    # the document task, where the paper measured DMA: WCM-bo, every model, both heads,
    # batch-rule models scored one article at a time
    wcm = [planner.config_dict(n, real=False)["finetune"] for n in nodes if n.stage.name == "wcm"]
    assert len(wcm) == 26 and {f["dataset"] for f in wcm} == {"wcm_bo"}
    assert {f["eval_routing"] for f in wcm} == {"per_text"}
    assert {f["max_len"] for f in wcm} == {cfg["pretrain"]["seq_len"]}


def test_slice_takes_the_first_documents(require_data, tmp_path: Path) -> None:
    from types import SimpleNamespace

    src = require_data("corpora/tibetan_tibettimes_news.txt.xz")
    ctx = SimpleNamespace(
        name="slice", inputs=[src], output=tmp_path, params={"max_docs": 5}, config=None
    )
    out = slice_corpus(ctx)  # type: ignore[arg-type]
    docs = [d for d in out.read_text(encoding="utf-8").split("\n\n") if d.strip()]
    assert len(docs) == 5
    assert all("\u0f0b" in d for d in docs)  # Tibetan text (tsheg)
    again = slice_corpus(ctx)  # type: ignore[arg-type]
    assert again.read_bytes() == out.read_bytes()


def test_tncc_recipes_plans_the_search_and_the_chosen_recipes(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.yaml").write_text("hidden_size: 16\n", "utf-8")
    spec = load_pipeline(PIPELINES / "tncc_recipes.yaml", [f"vars.model={model}"])
    steps = Planner(spec, tmp_path / "work").plan()
    names = [s.node.stage.name for s in steps]
    assert names.count("textcnn_search") == 4 and names.count("twin_search") == 4
    assert names[-3:] == ["textcnn", "twin", "pretrained"]
    planner = Planner(spec, tmp_path / "work")
    by_stage = {s.node.stage.name: planner.config_dict(s.node, False) for s in steps}
    twin, pretrained = by_stage["twin"]["finetune"], by_stage["pretrained"]["finetune"]
    assert twin["init"] == "random" and pretrained["init"] == "pretrained"
    assert twin["seeds"] == [1, 2, 3] and twin["head_lr"] > 0
    assert pretrained["optimizer"]["lr"] < twin["optimizer"]["lr"]
    assert by_stage["textcnn"]["finetune"]["encoder"] == "none"


def test_gpu_curve_continues_the_start_it_is_given(corpus_dir: Path, tmp_path: Path) -> None:
    """gpu_curve.yaml: the main job's two MLM stages from a carried start (its weights and its
    vocabulary), the exports at the CPU curve's points; the plan refuses a missing start."""
    start = tmp_path / "start"
    start.mkdir()
    (start / "model.safetensors").write_bytes(b"weights")
    spec = load_pipeline(PIPELINES / "gpu_curve.yaml", [f"vars.start={start}"])
    steps = Planner(spec, tmp_path / "work").plan()
    assert [s.node.stage.name for s in steps] == ["prepare", "pretrain", "titles", "adapt"]
    pre = spec.stages[1]
    assert pre.inputs == {
        "corpus": "${stages.prepare.output}",
        "vocab": str(start),
        "init": str(start),
    }
    with pytest.raises(ConfigError, match=r"stages\.pretrain\.inputs\.vocab is empty"):
        Planner(load_pipeline(PIPELINES / "gpu_curve.yaml"), tmp_path / "w2").plan()


def test_labels_pipeline_fine_tunes_the_main_jobs_models_at_each_label_count(tmp_path) -> None:
    """pipelines/labels.yaml: every system at every N with the same epoch cap and patience
    (the encoder and the twins: one schedule per N), and a clear error without its models."""
    with pytest.raises(
        ConfigError, match=r"(?s)stages\.encoder\.inputs\.model is empty.*--set vars\.NAME"
    ):
        Planner(load_pipeline(PIPELINES / "labels.yaml"), tmp_path / "w0").plan()
    encoder, base = tmp_path / "encoder", tmp_path / "base"
    for folder in (encoder, base):
        folder.mkdir()
        (folder / "model.yaml").write_text("{}\n")
    sets = [f"vars.encoder={encoder}", f"vars.base={base}"]
    spec = load_pipeline(PIPELINES / "labels.yaml", sets)
    planner = Planner(spec, tmp_path / "work")
    assert [s.action for s in planner.plan()] == ["run"] * 23
    runs: dict[str, dict[str, dict]] = {}
    for node in expand(spec):
        ft = planner.config_dict(node, real=False)["finetune"]
        runs.setdefault(node.stage.name, {})[node.variant] = ft
    sizes = {"n371": 371, "n742": 742, "n1855": 1855, "n3711": 3711, "all": 0}
    assert {k: v["limit_train"] for k, v in runs["encoder"].items()} == sizes
    for stage in ("twin", "twin_fast_head"):
        for n, ft in runs[stage].items():
            same = ("limit_train", "epochs", "patience", "layers", "seeds")
            assert {k: ft[k] for k in same} == {k: runs["encoder"][n][k] for k in same}
            assert ft["init"] == "random"
    assert set(runs["twin_fast_head"]) == set(sizes) - {"all"}
    assert (runs["twin_fast_head"]["n371"]["head_lr"], runs["twin"]["n371"]["head_lr"]) == (
        0.003,
        0.0,
    )
    for n, ft in runs["scratch"].items():
        vec = runs["vectors"][n]
        assert (ft["encoder"], ft["init"], vec["init"]) == ("none", "random", "pretrained")
        assert {k: ft[k] for k in ("epochs", "patience", "optimizer")} == {
            k: vec[k] for k in ("epochs", "patience", "optimizer")
        }
    assert runs["encoder"]["all"]["epochs"] == 8 and runs["vectors"]["all"]["epochs"] == 15
