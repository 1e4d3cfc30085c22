"""Baselines beside a pretrained model: the same shape and vocabulary with fresh weights
(`finetune.init=random`), TextCNN on that model's vocabulary, and the shipped pipeline that puts
all five systems in one experiment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.ft_fixtures import pretrained_env
from tibnlp.config import load_config
from tibnlp.errors import ConfigError
from tibnlp.evaluation.result_loader import load_results
from tibnlp.pipeline.grid import expand
from tibnlp.pipeline.planner import Planner
from tibnlp.pipeline.runner import run_pipeline
from tibnlp.pipeline.spec import load_pipeline
from tibnlp.text.vocab import Vocabulary
from tibnlp.training import finetune as ft_mod
from tibnlp.training.finetune import run_finetune

PIPELINE = Path(__file__).resolve().parents[1] / "pipelines" / "tncc_baselines.yaml"


@pytest.fixture
def env(tmp_path, monkeypatch):
    return pretrained_env(tmp_path, monkeypatch)


def _cfg(env, *extra: str):
    return load_config(
        None,
        [
            f"finetune.model={env.model}",
            f"finetune.output={env.tmp / 'runs'}",
            "finetune.epochs=1",
            "finetune.batch_size=16",
            "finetune.embedding_size=16",
            "finetune.cnn_channels=8",
            "finetune.optimizer.lr=0.01",
            "tracking.enabled=false",
            *extra,
        ],
    )


def test_random_init_takes_the_models_shape_and_vocabulary_not_its_weights(env) -> None:
    # the config's own model section is the default shape: it must not be what is built
    cfg = _cfg(env, "finetune.init=random", "model.hidden_size=48", "model.num_layers=3")
    setup = ft_mod.prepare(cfg, ft_mod.load_classification("tncc", "title"))
    assert setup.pretrained is None and setup.meta.source_model == ""
    assert (setup.meta.model.hidden_size, setup.meta.model.num_layers) == (16, 1)
    assert setup.vocab_dir == env.model
    assert setup.vocab.sha256 == Vocabulary.load(env.vocab).sha256
    assert setup.system == f"albert-random({env.model.name})+cnn"
    result = run_finetune(cfg, "tncc")
    saved = load_file(str(result.seeds[0].directory / "model.safetensors"))
    original = load_file(str(env.model / "model.safetensors"))
    assert saved.keys() >= {f"encoder.{k}" for k in original}
    weights = [k for k, v in original.items() if v.dim() == 2]  # embeddings, projections
    assert weights and not any(torch.equal(saved[f"encoder.{k}"], original[k]) for k in weights)
    assert result.notes["model"] == f"random init with the shape of {env.model}"


def test_textcnn_uses_the_model_directorys_vocabulary(env) -> None:
    cfg = _cfg(env, "finetune.encoder=none", "finetune.init=random")
    setup = ft_mod.prepare(cfg, ft_mod.load_classification("tncc", "title"))
    assert setup.meta.encoder == "embedding" and setup.pretrained is None
    assert setup.meta.vocab_sha256 == Vocabulary.load(env.vocab).sha256
    assert setup.meta.vocab_size == setup.vocab.size
    result = run_finetune(cfg, "tncc")
    assert result.system == "textcnn-pieces(scratch)"
    assert result.notes["vocab"] == str(env.model)


def test_textcnn_starts_from_a_pretrained_models_piece_embeddings(env) -> None:
    """The static-vector baseline: the model's word embedding, rescaled to the from-scratch
    table's std 1 (the TextCNN has no LayerNorm to make the scale irrelevant)."""
    cfg = _cfg(env, "finetune.encoder=none")
    setup = ft_mod.prepare(cfg, ft_mod.load_classification("tncc", "title"))
    word = load_file(str(env.model / "model.safetensors"))["embeddings.word.weight"]
    assert setup.meta.encoder == "embedding" and setup.pretrained is not None
    assert (setup.meta.vocab_size, setup.meta.embedding_size) == tuple(word.shape)
    table = setup.pretrained["embeddings.weight"]
    assert torch.allclose(table, word / word.std()) and table.std().item() == pytest.approx(1.0)
    result = run_finetune(cfg, "tncc")
    assert result.system == "textcnn-pieces(pretrained)"
    assert result.notes["model"] == str(env.model)


def test_textcnn_on_pretrained_embeddings_needs_a_cnn_head() -> None:
    with pytest.raises(ConfigError, match=r"finetune\.head"):
        load_config(None, ["finetune.encoder=none", "finetune.model=/m", "finetune.head=linear"])


def test_baselines_pipeline_expands_to_five_systems(env) -> None:
    spec = load_pipeline(PIPELINE, [f"vars.model={env.model}", "vars.epochs=3"])
    nodes = expand(spec)
    assert [n.variant for n in nodes] == [
        "textcnn",
        "pretrained-cnn",
        "random-cnn",
        "pretrained-linear",
        "random-linear",
    ]
    planner = Planner(spec, env.tmp / "work")
    ft = {n.variant: planner.config_dict(n, real=False)["finetune"] for n in nodes}
    assert ft["textcnn"]["encoder"] == "none" and ft["textcnn"]["init"] == "random"
    assert ft["textcnn"]["optimizer"]["lr"] == 0.001 and ft["textcnn"]["epochs"] == 10
    for name in ("pretrained-cnn", "random-cnn", "pretrained-linear", "random-linear"):
        init, head = name.split("-")
        assert (ft[name]["encoder"], ft[name]["init"], ft[name]["head"]) == ("albert", init, head)
        assert ft[name]["epochs"] == 3 and ft[name]["optimizer"]["lr"] == 0.0001
    assert {f["seeds"] == [1, 2, 3] and f["task"] == "title" for f in ft.values()} == {True}
    steps = planner.plan()
    assert [s.action for s in steps] == ["run"] * 5
    # the model directory is an input counted by content: every row reads the same one
    assert len({json.dumps(s.inputs) for s in steps}) == 1
    assert str(env.model) not in PIPELINE.read_text()


def test_baselines_pipeline_runs_into_one_table(env) -> None:
    overrides = [
        f"vars.model={env.model}",
        "vars.seeds=[1]",
        "vars.epochs=1",
        "vars.textcnn_epochs=1",
        "vars.eval_also=[]",
        "finetune.batch_size=16",
        "finetune.cnn_channels=8",
        "finetune.embedding_size=16",
    ]
    spec = load_pipeline(PIPELINE, overrides)
    uri = f"sqlite:///{env.tmp / 'mlflow.db'}"
    work = env.tmp / "work"
    result = run_pipeline(spec, tracking_uri=uri, echo=lambda _: None, workdir=work)
    assert len(result.ran) == 5
    rows = load_results([work / "finetune"])
    systems = sorted(r["system"] for r in rows)
    name = env.model.name
    assert systems == sorted(
        [
            "textcnn-pieces(scratch)",
            f"albert-pretrained({name})+cnn",
            f"albert-random({name})+cnn",
            f"albert-pretrained({name})+linear-cls",
            f"albert-random({name})+linear-cls",
        ]
    )
    assert {r["dataset"] for r in rows} == {"tncc-title"}
    assert all("test_unseen" in r["aggregate"] for r in rows)
    again = run_pipeline(spec, tracking_uri=uri, echo=lambda _: None, workdir=work)
    assert len(again.skipped) == 5  # cached: a rerun of the command only reprints the table


def test_report_names_a_file_that_is_not_a_result(tmp_path) -> None:
    from tibnlp.errors import DataError

    other = tmp_path / "results.json"
    other.write_text(json.dumps({"system": "x", "test_macro_f1": 0.5}), "utf-8")
    with pytest.raises(DataError, match="not a fine-tuning result"):
        load_results([other])
    with pytest.raises(DataError, match=r"no results\.json under"):
        load_results([tmp_path])


def test_summary_table_counts_the_pretraining_behind_textcnn_on_pretrained_embeddings() -> None:
    from tibnlp.evaluation.report import summary_table

    agg = {s: {m: {"mean": 0.6, "std": 0.01} for m in ("macro_f1", "weighted_f1")}
           for s in ("test", "validation")}  # fmt: skip

    def row(system: str, tokens: float | None) -> dict:
        notes = {"pretraining": {"tokens": tokens}} if tokens is not None else {}
        return {"system": system, "dataset": "tncc-title", "seeds": [{}, {}],
                "aggregate": agg, "notes": notes}  # fmt: skip

    table = summary_table(
        [row("textcnn-pieces(pretrained)", 6_003_391), row("textcnn-pieces(scratch)", None)]
    )
    lines = {line.split(" | ")[1]: line.split(" | ")[2] for line in table.splitlines()[4:6]}
    assert lines == {
        "textcnn-pieces(pretrained)": "6,003,391",
        "textcnn-pieces(scratch)": "none",
    }


def test_a_max_len_past_the_encoders_positions_is_said(env, capsys, monkeypatch) -> None:
    """finetune.max_len above the encoder's max_len was lowered to it without a word."""
    setup = ft_mod.prepare(
        _cfg(env, "finetune.max_len=200"), ft_mod.load_classification("tncc", "title")
    )
    assert setup.meta.max_len == 64
    assert "finetune.max_len 200 is past the 64 positions" in capsys.readouterr().err
    ft_mod.prepare(_cfg(env, "finetune.max_len=48"), ft_mod.load_classification("tncc", "title"))
    assert "past the" not in capsys.readouterr().err
    # memory reading: refused at once (no room for its memory), not first said to read 64
    memory = _cfg(env, "finetune.max_len=200", "finetune.long_document=memory")
    with pytest.raises(ConfigError, match="memory"):
        ft_mod.prepare(memory, ft_mod.load_classification("tncc", "title"))
    assert "past the" not in capsys.readouterr().err
    monkeypatch.setenv("RANK", "1")  # data parallel: said once, by the main process
    ft_mod.prepare(_cfg(env, "finetune.max_len=200"), ft_mod.load_classification("tncc", "title"))
    assert "past the" not in capsys.readouterr().err
