"""test_unseen holds the test items whose model input the classifier was not trained on."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.test_finetune import _cfg, env  # noqa: F401  (fixture)
from tibnlp.training.finetune import run_finetune


def _rewrite_test(edit) -> None:
    tncc = Path(os.environ["TIBNLP_DATA"]) / "tncc"
    lines = (tncc / "tncc_title_train.jsonl").read_text("utf-8").splitlines()
    train = [json.loads(x) for x in lines]
    path = tncc / "tncc_title_test.jsonl"
    test = [json.loads(x) for x in path.read_text("utf-8").splitlines()]
    edit(train, test)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in test), "utf-8")


def _copy(test: list[dict], i: int, record: dict, text: str) -> None:
    test[i] = {**test[i], "text": text, "label": record["label"], "label_id": record["label_id"]}


def test_unseen_is_against_the_training_examples_used(env) -> None:  # noqa: F811
    # the fixture's test[0] is train[0]; test[1] copies the last train title, which
    # limit_train=48 leaves out: the classifier never saw it, so it is unseen
    _rewrite_test(lambda train, test: _copy(test, 1, train[-1], train[-1]["text"]))
    full = run_finetune(_cfg(env, "finetune.epochs=1", "finetune.seeds=[1]"), "tncc")
    assert full.seeds[0].metrics["test_unseen"].count == 28
    few = run_finetune(
        _cfg(env, "finetune.epochs=1", "finetune.limit_train=48", "finetune.seeds=[1]"), "tncc"
    )
    assert few.seeds[0].metrics["test_unseen"].count == 29
    assert few.notes["test_unseen"].startswith("29 of 30")


def test_unseen_compares_texts_in_the_models_input_form(env) -> None:  # noqa: F811
    # a closing shad is trimmed from the model's input (text_form tsheg-trimmed, the default):
    # test[1] is train[1] plus a shad, the very same ids, so it is not unseen
    _rewrite_test(lambda train, test: _copy(test, 1, train[1], train[1]["text"] + "\u0f0d"))
    result = run_finetune(_cfg(env, "finetune.epochs=1", "finetune.seeds=[1]"), "tncc")
    assert result.seeds[0].metrics["test_unseen"].count == 28


def test_a_test_split_inside_train_warns_and_scores_without_an_unseen_plot(env, capsys) -> None:  # noqa: F811
    """Every test text also in train: an empty test_unseen crashed plotting its confusion
    after training (AxisError), leaving the seed folder without its record, so every rerun
    trained and crashed again. Now it warns before training and the seed finishes."""

    def inside(train: list[dict], test: list[dict]) -> None:
        for i in range(len(test)):
            _copy(test, i, train[i], train[i]["text"])

    _rewrite_test(inside)
    cfg = _cfg(env, "finetune.epochs=1", "finetune.seeds=[1]")
    result = run_finetune(cfg, "tncc")
    said = " ".join(capsys.readouterr().err.split())
    assert "warning: dataset 'tncc-title': 0 of 30 test texts are unseen" in said
    assert "the test score is a score on training texts" in said
    (seed,) = result.seeds
    assert seed.metrics["test_unseen"].count == 0 and seed.metrics["test"].count == 30
    assert (seed.directory / "seed_result.json").exists()
    assert (seed.directory / "confusion_test.png").exists()
    assert not (seed.directory / "confusion_test_unseen.png").exists()
    run_finetune(cfg, "tncc")  # the rerun reports the finished seed
    assert "finished earlier" in capsys.readouterr().err


def test_limit_train_on_a_file_sorted_by_label_says_what_it_left_out(env, capsys) -> None:  # noqa: F811
    """The first N of a training file sorted by label (TUSA's) hold one class: a classifier
    trained on them reported a score without any warning. A smoke run may still want it."""
    path = Path(os.environ["TIBNLP_DATA"]) / "tncc" / "tncc_title_train.jsonl"
    train = [json.loads(x) for x in path.read_text("utf-8").splitlines()]
    train.sort(key=lambda r: r["label"])  # stable: each class's titles stay in order
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in train), "utf-8")
    labels = [r["label"] for r in train]
    last_first = max(labels.index(label) for label in set(labels)) + 1
    few = ["finetune.epochs=1", "finetune.limit_train=20", "finetune.seeds=[1]"]
    result = run_finetune(_cfg(env, *few), "tncc")
    said = " ".join(capsys.readouterr().err.split())
    assert "warning: finetune.limit_train=20: the first 20" in said
    assert "hold 1 of its 3 classes" in said and f"first {last_first}:" in said
    assert result.notes["limit_train"].startswith("finetune.limit_train=20")
    enough = ["finetune.epochs=1", f"finetune.limit_train={last_first}", "finetune.seeds=[1]"]
    result = run_finetune(_cfg(env, *enough), "tncc")
    assert "limit_train" not in result.notes and "limit_train=" not in capsys.readouterr().err
