"""What fine-tuning records beside its scores: the pretraining behind its encoder (params
`pretrain.*`, what a learning curve plots) and a warning when a seed stays at the
majority-class level (a collapsed classifier is marked, not reported as a result)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from mlflow.tracking import MlflowClient

from tests.ft_fixtures import TINY_MODEL, make_data_dir, make_vocab
from tibnlp.config import load_config
from tibnlp.data.tasks import load_advts
from tibnlp.evaluation.metrics import compute_metrics, majority_macro_f1, not_learning
from tibnlp.evaluation.report import markdown_table
from tibnlp.evaluation.result_loader import load_results
from tibnlp.text.vocab import Vocabulary
from tibnlp.tracking.testing import sqlite_store
from tibnlp.training import finetune as ft_mod
from tibnlp.training.classification import SeedTraining
from tibnlp.training.finetune import run_finetune
from tibnlp.training.finetune_splits import texts

FACTS = {
    "step": 40,
    "tokens": 81920,
    "train_seconds": 12.5,
    "flops": 3.5e12,
    "hardware": "AMD EPYC test",
    "processes": 2,
    "threads": 1,
}


@pytest.fixture
def env(tmp_path, monkeypatch):
    import shutil

    from tibnlp.models.encoder import Encoder
    from tibnlp.models.io import save_pretrained
    from tibnlp.text.vocab import Vocabulary

    monkeypatch.setenv("TIBNLP_DATA", str(make_data_dir(tmp_path / "data")))
    vocab = make_vocab(tmp_path / "vocab")
    cfg = load_config(None, TINY_MODEL).model
    cfg.vocab_size = Vocabulary.load(vocab).size
    model = tmp_path / "exports" / "tokens-81920"
    save_pretrained(Encoder(cfg), cfg, model, extra=FACTS)  # as a pretraining export writes it
    for f in vocab.iterdir():
        shutil.copy2(f, model / f.name)
    return SimpleNamespace(tmp=tmp_path, model=model, uri=sqlite_store(tmp_path))


def _cfg(env, *extra: str):
    return load_config(
        None,
        [
            f"finetune.model={env.model}",
            f"finetune.output={env.tmp / 'runs'}",
            "finetune.epochs=1",
            "finetune.batch_size=16",
            "finetune.cnn_channels=8",
            f"tracking.uri={env.uri}",
            "tracking.experiment=notes",
            *extra,
        ],
    )


def _seed_runs(uri: str) -> list:
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("notes").experiment_id])
    return [r for r in runs if r.data.tags.get("mlflow.parentRunId")]


def test_pretraining_behind_the_encoder_is_logged(env) -> None:
    run_finetune(_cfg(env), "tncc")
    run_finetune(_cfg(env, "finetune.init=random"), "tncc")  # the twin: same shape, no pretraining
    by_init = {r.data.params["finetune.init"]: r.data.params for r in _seed_runs(env.uri)}
    pretrained, random = by_init["pretrained"], by_init["random"]
    for key in ("step", "tokens", "train_seconds", "flops", "hardware", "processes"):
        assert pretrained[f"pretrain.{key}"] == str(FACTS[key])
    assert random["pretrain.tokens"] == "0" and random["pretrain.train_seconds"] == "0"


def test_majority_level_is_the_one_class_predictor() -> None:
    y = [0, 0, 0, 1, 2, 0, 1]
    stuck = compute_metrics(y, [0] * len(y), ["a", "b", "c"])
    assert majority_macro_f1(y, 3) == pytest.approx(stuck.summary["macro_f1"])
    assert not_learning(stuck.summary["macro_f1"] + 0.01, majority_macro_f1(y, 3))
    assert not not_learning(0.9, majority_macro_f1(y, 3))


def test_a_seed_at_the_majority_class_warns_tags_and_is_marked(env, monkeypatch, capsys) -> None:
    def collapsed(model, x_train, y_train, x_val, y_val, ft, seed, run, engine, labels, *_):
        # seed 1 predicts one class on validation; seed 2 learns
        pred = [0] * len(y_val) if seed == 1 else list(y_val)
        return SeedTraining(1, 1, compute_metrics(y_val, pred, labels))

    monkeypatch.setattr(ft_mod, "train_one_seed", collapsed)
    result = run_finetune(_cfg(env, "finetune.seeds=[1,2]"), "tncc")
    err = capsys.readouterr().err
    assert "warning:" in err and "seed 1 is not learning" in err and "seed 2" not in err
    assert "majority-class level" in err
    tags = {r.data.tags["seed"]: r.data.tags for r in _seed_runs(env.uri)}
    assert tags["1"]["warning"] == "majority_class" and "warning" not in tags["2"]
    # the report marks the result instead of presenting its scores as one
    table = markdown_table(load_results([result.output]))
    assert "NOT LEARNING: 1/2 seeds at majority class" in table


def test_texts_of_an_extra_set_cut_at_the_read_length_are_counted(env, capsys) -> None:
    """AdvTS (`finetune.eval_also`) texts cut at the read length are counted per part as the
    run's own splits are (results notes, parent-run metrics, a line on stderr): its scores
    may be read from cut texts."""
    read = 6  # [CLS] + 4 pieces + [SEP]: the AdvTS texts (test titles + a syllable) are cut
    cfg = _cfg(env, f"finetune.max_len={read}", "finetune.eval_also=[advts]")
    result = run_finetune(cfg, "tncc")
    vocab, advts = Vocabulary.load(env.model), load_advts("tncc")
    form = cfg.finetune.text_form
    cut = result.notes["cut_at_read_length"]
    saved = load_results([result.output])[0]["notes"]["cut_at_read_length"]
    client = MlflowClient(env.uri)
    runs = client.search_runs([client.get_experiment_by_name("notes").experiment_id])
    parent = next(r for r in runs if not r.data.tags.get("mlflow.parentRunId"))
    for part, split in (("advts_original", "original"), ("advts", "adversarial")):
        over = [len(vocab.encode(t)) - (read - 2) for t in texts(advts, split, form)]
        want = {"texts": sum(d > 0 for d in over), "tokens_dropped": sum(d for d in over if d > 0)}
        assert want["texts"] > 0
        assert cut[part] == saved[part] == want
        assert parent.data.metrics[f"cut_{part}_texts"] == want["texts"]
        assert parent.data.metrics[f"cut_{part}_tokens_dropped"] == want["tokens_dropped"]
    err = capsys.readouterr().err
    assert f"{cut['advts']['texts']} of 12 advts texts (finetune.eval_also)" in err
