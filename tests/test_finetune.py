"""Fine-tuning end to end on a tiny synthetic task: seeds, aggregation, files, MLflow, errors."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.ft_fixtures import TINY_MODEL, make_data_dir, make_model_dir, make_vocab
from tibnlp.config import load_config
from tibnlp.errors import ConfigError, DataError
from tibnlp.evaluation.significance import compare_rows
from tibnlp.tracking import PrefixedRun
from tibnlp.training import finetune as ft_mod
from tibnlp.training import finetune_scores as scores_mod
from tibnlp.training import finetune_seeds as seeds_mod
from tibnlp.training.finetune import run_finetune


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("TIBNLP_DATA", str(make_data_dir(tmp_path / "data")))
    vocab = make_vocab(tmp_path / "vocab")
    return SimpleNamespace(tmp=tmp_path, vocab=vocab)


def cfg_flags(env, *extra: str) -> list[str]:
    """The tiny TextCNN's settings, as --set takes them."""
    return [
        f"finetune.vocab={env.vocab}",
        f"finetune.output={env.tmp / 'runs'}",
        "finetune.encoder=none",
        "finetune.epochs=5",
        "finetune.batch_size=16",
        "finetune.embedding_size=16",
        "finetune.cnn_channels=8",
        "finetune.optimizer.lr=0.01",
        "tracking.enabled=false",
        *extra,
    ]


def _cfg(env, *extra: str):
    return load_config(None, cfg_flags(env, *extra))


def test_scratch_textcnn_trains_and_aggregates_seeds(env) -> None:
    result = run_finetune(_cfg(env, "finetune.seeds=[1,2]", "finetune.eval_also=[advts]"), "tncc")
    assert result.system == "textcnn-pieces(scratch)" and result.dataset == "tncc-title"
    assert [s.seed for s in result.seeds] == [1, 2]
    # the synthetic classes are separable: training must get well above chance (1/3)
    assert result.aggregate["validation"]["accuracy"][0] > 0.6
    # aggregation = mean and sample std of the per-seed values
    values = [s.metrics["test"]["macro_f1"] for s in result.seeds]
    mean, std = result.aggregate["test"]["macro_f1"]
    assert mean == pytest.approx(np.mean(values)) and std == pytest.approx(np.std(values, ddof=1))
    # leakage: the fixture puts exactly one train title in test
    assert result.seeds[0].metrics["test_unseen"].count == 29
    assert result.seeds[0].metrics["advts"].count == 12
    assert result.notes["input_form"].startswith("tsheg")
    seed_dir = result.seeds[0].directory
    for name in ("classifier.yaml", "model.safetensors", "spm.model", "confusion_test.png"):
        assert (seed_dir / name).is_file()
    saved = json.loads((result.output / "results.json").read_text("utf-8"))
    assert saved["aggregate"]["test"]["macro_f1"]["mean"] == pytest.approx(mean)
    # item-level predictions are kept: a paired bootstrap can compare this run with another
    test = result.seeds[0].metrics["test"]
    assert saved["targets"]["test"] == test.targets and len(test.targets) == test.count
    assert [s["predictions"]["test"] for s in saved["seeds"]] == [
        s.metrics["test"].predictions for s in result.seeds
    ]
    assert compare_rows(saved, saved).diff == 0
    lines = (result.output / "results.json").read_text("utf-8").splitlines()
    one_line = [ln for ln in lines if ln.strip().startswith('"test": [') and "]" in ln]
    assert len(one_line) == 1 + len(result.seeds)  # the targets, then each seed's predictions


def test_encoder_dropout_overrides_the_models_own(env) -> None:
    data = ft_mod.load_classification("tncc", "title")
    model = make_model_dir(env.tmp, env.vocab)
    albert = ("finetune.encoder=albert", f"finetune.model={model}", "finetune.vocab=")
    kept = ft_mod.prepare(_cfg(env, *albert), data).meta.model
    setup = ft_mod.prepare(_cfg(env, *albert, "finetune.encoder_dropout=0.2"), data)
    assert (setup.meta.model.dropout, setup.meta.model.attention_dropout) == (0.2, 0.2)
    assert kept.dropout == 0.1  # -1 (the default): the model directory's value
    from tibnlp.models.classifier_io import build_classifier

    drops = [m.p for m in build_classifier(setup.meta).modules() if type(m).__name__ == "Dropout"]
    assert 0.2 in drops


def test_recipe_note_gives_the_encoders_dropout_in_effect(env) -> None:
    """The result's recipe shows the encoder's dropout as fine-tuning ran it (the model's own
    unless finetune.encoder_dropout is set), beside the head's `dropout`: a model pretrained
    without dropout is fine-tuned without it by default, which the note must not hide."""
    model = make_model_dir(env.tmp, env.vocab)  # dropout 0.1 (the model section's default)
    albert = ("finetune.encoder=albert", f"finetune.model={model}", "finetune.vocab=")
    one = ("finetune.epochs=1", "finetune.dropout=0.3")
    kept = run_finetune(_cfg(env, *albert, *one), "tncc").notes["recipe"]
    assert (kept["dropout"], kept["encoder_dropout"], kept["attention_dropout"]) == (0.3, 0.1, 0.1)
    off = _cfg(env, *albert, *one, "finetune.encoder_dropout=0", "finetune.seeds=[2]")
    recipe = run_finetune(off, "tncc").notes["recipe"]
    assert (recipe["encoder_dropout"], recipe["attention_dropout"]) == (0.0, 0.0)
    # TextCNN has no encoder: no encoder dropout to report
    textcnn = run_finetune(_cfg(env, "finetune.epochs=1"), "tncc").notes["recipe"]
    assert "encoder_dropout" not in textcnn and textcnn["dropout"] == 0.1


def test_best_epoch_is_restored(env, monkeypatch) -> None:
    logged: list[dict] = []

    class Recorder:
        run_id = None

        def log_metrics(self, metrics, step=None):
            logged.append(dict(metrics))

    data = ft_mod.load_classification("tncc", "title")
    cfg = _cfg(env, "finetune.epochs=4", "finetune.patience=4")
    setup = ft_mod.prepare(cfg, data)
    from tibnlp.models.classifier_io import build_classifier

    model = build_classifier(setup.meta)
    best, ran, validation = ft_mod.train_one_seed(
        model,
        setup.ids["train"],
        data.targets("train"),
        setup.ids["validation"],
        data.targets("validation"),
        cfg.finetune,
        1,
        Recorder(),  # type: ignore[arg-type]
        labels=data.labels,
    )
    history = [m["eval/macro_f1"] for m in logged if "eval/macro_f1" in m]
    assert ran == 4 and best == int(np.argmax(history)) + 1
    probs = scores_mod.predict_proba(model, setup.ids["validation"])
    final = scores_mod.compute_metrics(
        data.targets("validation"), probs.argmax(1).tolist(), data.labels
    )["macro_f1"]
    assert final == pytest.approx(max(history))
    # the selected epoch's scores come back with it, labelled: the split is not scored again
    assert validation["macro_f1"] == pytest.approx(final) and list(validation.labels) == list(
        data.labels
    )


def test_half_precision_training_is_scored_as_predict_loads_it(env, monkeypatch) -> None:
    """DeepSpeed's fp16 mode (a GPU without bf16) casts the module's own weights to half
    precision. The seed was then scored in half precision, while `tibnlp predict` loads the
    saved weights into an fp32 classifier: reported scores need not be predict's. Here the
    cast is simulated on the CPU after training; every part must be scored in fp32."""
    from tibnlp.evaluation.predict import Predictor

    real_train, real_predict = ft_mod.train_one_seed, scores_mod.predict_proba
    dtypes: list[torch.dtype] = []

    def train_then_half(model, *args, **kwargs):  # type: ignore[no-untyped-def]
        trained = real_train(model, *args, **kwargs)
        model.half()  # as deepspeed.initialize leaves it under fp16
        return trained

    def predict(model, *args, **kwargs):  # type: ignore[no-untyped-def]
        dtypes.append(next(model.parameters()).dtype)
        return real_predict(model, *args, **kwargs)

    monkeypatch.setattr(ft_mod, "train_one_seed", train_then_half)
    monkeypatch.setattr(scores_mod, "predict_proba", predict)
    result = run_finetune(_cfg(env, "finetune.epochs=1"), "tncc")
    assert dtypes and set(dtypes) == {torch.float32}
    seed = result.seeds[0]
    data = ft_mod.load_classification("tncc", "title")
    predicted = Predictor(seed.directory).predict(data.texts("validation"))
    labels = [data.labels.index(p["prediction"]) for p in predicted]
    assert seed.metrics["validation"].predictions == labels  # scored again, as predict does


def test_one_mlflow_run_per_seed_under_a_parent(env) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{env.tmp / 'mlflow.db'}"
    tracking = [f"tracking.uri={uri}", "tracking.enabled=true"]
    cfg = _cfg(env, "finetune.seeds=[1,2]", "finetune.epochs=1", *tracking)
    result = run_finetune(cfg, "tncc")
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("tibnlp")
    runs = client.search_runs([experiment.experiment_id])
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    parents = [r for r in runs if not r.data.tags.get("mlflow.parentRunId")]
    assert len(parents) == 1 and len(children) == 2
    assert {r.info.run_id for r in children} == {s.run_id for s in result.seeds}
    assert "test_macro_f1_mean" in parents[0].data.metrics
    assert "test_unseen_weighted_f1" in children[0].data.metrics
    # robustness to a typed closing shad, beside the scores (tibnlp.evaluation.robustness)
    assert "test_shad_flip_rate" in children[0].data.metrics
    assert "test_shad_flip_rate_mean" in parents[0].data.metrics


def test_a_standalone_rerun_is_counted_once_by_runs_compare(env) -> None:
    """`tibnlp finetune` run again into the same output folder opens a new parent run and
    re-reports its finished seeds under it; `runs compare` and `runs plot` count each seed
    record once (a pipeline resumes its stage's run instead, see test_runs_edges)."""
    from tibnlp.tracking.compare import compare_runs

    uri = f"sqlite:///{env.tmp / 'mlflow.db'}"
    tracking = [f"tracking.uri={uri}", "tracking.enabled=true"]
    first = run_finetune(_cfg(env, "finetune.seeds=[1,2]", "finetune.epochs=1", *tracking), "tncc")
    more = _cfg(env, "finetune.seeds=[1,2,3]", "finetune.epochs=1", *tracking)
    again = run_finetune(more, "tncc")  # seeds 1 and 2 resumed, seed 3 trained
    assert [s.run_id for s in again.seeds][:2] != [s.run_id for s in first.seeds]
    result = compare_runs("tibnlp", ["test_macro_f1"], uri=uri)
    ((_, n, (cell,)),) = result.rows
    assert n == 3, result.markdown()
    expected = [s.metrics["test"]["macro_f1"] for s in again.seeds]
    assert cell.mean == pytest.approx(np.mean(expected))


def test_a_plain_rerun_keeps_the_advts_scores_in_runs_compare(env) -> None:
    """A rerun without --eval-also advts reports the seed's own parts (its result has no AdvTS
    columns) in a new run, while the seed's record still holds the AdvTS scores: `runs
    compare` keeps the latest run of the record, and showed no AdvTS score any more."""
    from tibnlp.tracking.compare import compare_runs

    uri = f"sqlite:///{env.tmp / 'mlflow.db'}"
    tracking = [f"tracking.uri={uri}", "tracking.enabled=true", "finetune.epochs=1"]
    first = run_finetune(_cfg(env, "finetune.eval_also=[advts]", *tracking), "tncc")
    again = run_finetune(_cfg(env, *tracking), "tncc")  # reported from the record
    assert "advts" not in again.seeds[0].metrics
    result = compare_runs("tibnlp", ["test_macro_f1", "advts_accuracy"], uri=uri)
    ((_, n, (advts, test)),) = result.rows
    assert n == 1, result.markdown()
    assert advts.values == [pytest.approx(first.seeds[0].metrics["advts"]["accuracy"])]
    assert test.values == [pytest.approx(again.seeds[0].metrics["test"]["macro_f1"])]


def test_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"finetune.head"):
        load_config(None, ["finetune.encoder=none", "finetune.vocab=v", "finetune.head=linear"])
    with pytest.raises(ConfigError, match=r"finetune.task"):
        load_config(None, ["finetune.task=summary"])
    with pytest.raises(ConfigError, match=r"finetune.eval_also"):
        load_config(None, ["finetune.eval_also=[sst2]"])


def test_batch_the_processes_cannot_split_is_refused_before_tokenising(monkeypatch) -> None:
    """16 texts per step over 3 processes: refused at once, naming finetune.batch_size (not
    pretrain's), before the task is read and tokenised."""

    def past_the_check(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the run went on past the batch-size check")

    monkeypatch.setattr(ft_mod, "load_classification", past_the_check)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    cfg = load_config(None, ["finetune.batch_size=16", "tracking.enabled=false"])
    with pytest.raises(ConfigError, match=r"'finetune\.batch_size': 16 .* 3 processes"):
        run_finetune(cfg, "tncc")


def test_missing_vocabulary_and_model_dirs(env) -> None:
    with pytest.raises(DataError, match="does not exist"):
        run_finetune(_cfg(env, f"finetune.vocab={env.tmp / 'nope'}"), "tncc")
    cfg = _cfg(env, "finetune.encoder=albert", f"finetune.model={env.tmp / 'nope'}")
    with pytest.raises(DataError, match=r"model directory .* does not exist"):
        run_finetune(cfg, "tncc")
    (env.tmp / "a_file").write_text("x")
    cfg = _cfg(env, "finetune.encoder=albert", f"finetune.model={env.tmp / 'a_file'}")
    with pytest.raises(DataError, match=r"model directory .*a_file is a file, not a folder"):
        run_finetune(cfg, "tncc")


def test_advts_only_for_tncc_titles_and_tusa() -> None:
    setup = SimpleNamespace(data=SimpleNamespace(name="wcm_bo"))
    with pytest.raises(DataError, match="AdvTS has no adversarial set for 'wcm_bo'"):
        ft_mod._advts(setup, ["advts"])  # type: ignore[arg-type]


def test_document_task_absent_fails_before_training(env) -> None:
    with pytest.raises(DataError) as err:
        run_finetune(_cfg(env, "finetune.task=document"), "tncc", "document")
    assert "FudanNLP" in (err.value.hint or "")


def _pretrained_dir(env, vocab_size: int | None = None):
    return make_model_dir(env.tmp, env.vocab, vocab_size)


@pytest.mark.parametrize("head", ["cnn", "linear"])
def test_random_init_albert_baseline_with_both_heads(env, head) -> None:
    cfg = _cfg(
        env, "finetune.encoder=albert", f"finetune.head={head}", "finetune.epochs=2", *TINY_MODEL
    )
    result = run_finetune(cfg, "tncc")
    assert result.system == f"albert-random+{'cnn' if head == 'cnn' else 'linear-cls'}"
    assert result.seeds[0].metrics["test"].count == 30


def test_head_and_encoder_get_their_learning_rates(env, built) -> None:
    """finetune.head_lr: the head's parameters form their own groups at that peak rate, the
    encoder's keep optimizer.lr; the schedule scales both by the same factor."""
    extra = ["finetune.encoder=albert", "finetune.epochs=1", "finetune.warmup_ratio=0", *TINY_MODEL]
    run_finetune(_cfg(env, "finetune.optimizer.lr=0.001", "finetune.head_lr=0.02", *extra), "tncc")
    model, optimizer = built[-1]
    rate = {id(p): g["initial_lr"] for g in optimizer.param_groups for p in g["params"]}
    names = dict(model.named_parameters())
    head = [n for n in names if n.startswith("model.head.")]
    encoder = [n for n in names if n.startswith("model.encoder.")]
    assert head and encoder and len(head) + len(encoder) == len(names)
    assert {rate[id(names[n])] for n in head} == {0.02}
    assert {rate[id(names[n])] for n in encoder} == {0.001}
    # same factor for every group at every step (here the linear decay's last step)
    factors = {g["lr"] / g["initial_lr"] for g in optimizer.param_groups}
    assert len({round(f, 12) for f in factors}) == 1
    # head_lr 0: one rate for all, in the two weight-decay groups as before
    run_finetune(_cfg(env, "finetune.optimizer.lr=0.001", "finetune.seeds=[2]", *extra), "tncc")
    assert [g["initial_lr"] for g in built[-1][1].param_groups] == [0.001, 0.001]
    with pytest.raises(ConfigError, match=r"finetune.head_lr"):
        load_config(None, ["finetune.head_lr=-0.001"])


def test_embedding_layer_gets_its_own_learning_rate(env, built) -> None:
    """finetune.embedding_lr: the encoder's embedding layer (pieces and their projection) at
    its own peak rate, beside the head's and the transformer's; refused when negative."""
    rates = ["finetune.optimizer.lr=0.0003", "finetune.head_lr=0.02", "finetune.embedding_lr=0.001"]
    extra = ["finetune.encoder=albert", "finetune.epochs=1", "finetune.warmup_ratio=0", *TINY_MODEL]
    run_finetune(_cfg(env, *rates, *extra), "tncc")
    model, optimizer = built[-1]
    rate = {id(p): g["initial_lr"] for g in optimizer.param_groups for p in g["params"]}
    by_rate: dict[float, set[str]] = {}
    for name, p in model.named_parameters():  # model.{encoder,head}.PART...
        by_rate.setdefault(rate[id(p)], set()).add(name.split(".")[2])
    # the embedding layer, the transformer (layers and final norm) and the head apart
    assert by_rate[0.001] == {"embeddings"}
    assert by_rate[0.02] == {"convs", "out"}  # model.head.*
    assert "embeddings" not in by_rate[0.0003] and by_rate[0.0003]
    word = "model.encoder.embeddings.word.weight"
    assert rate[id(dict(model.named_parameters())[word])] == 0.001
    with pytest.raises(ConfigError, match=r"finetune.embedding_lr"):
        load_config(None, ["finetune.embedding_lr=-1"])


def test_pretrained_model_dir_is_fine_tuned_and_frozen(env) -> None:
    model_dir = _pretrained_dir(env)
    cfg = _cfg(
        env,
        "finetune.encoder=albert",
        f"finetune.model={model_dir}",
        "finetune.vocab=",
        "finetune.freeze_encoder=true",
        "finetune.epochs=1",
    )
    result = run_finetune(cfg, "tncc")
    assert result.system.startswith("albert-pretrained(") and result.system.endswith("+frozen")
    # the frozen encoder's weights are exactly the pretrained ones
    from safetensors.torch import load_file

    saved = load_file(str(result.seeds[0].directory / "model.safetensors"))
    original = load_file(str(model_dir / "model.safetensors"))
    for key, value in original.items():
        assert torch.equal(saved[f"encoder.{key}"], value)


def test_probe_epochs_train_the_head_on_the_frozen_encoder_first(env, monkeypatch) -> None:
    """finetune.probe_epochs (LP-FT): a first phase trains the head alone at probe_lr with the
    encoder frozen at its pretrained weights and logs under probe/; the fine-tuning then starts
    from that head with every weight trainable."""
    model_dir = _pretrained_dir(env)
    calls: list[dict] = []
    train = ft_mod.train_one_seed

    def recording(model, *args, **kwargs):
        ft, run = args[4], args[6]
        state = {k: v.clone() for k, v in model.state_dict().items()}
        frozen = [not p.requires_grad for p in model.encoder.parameters()]
        out = train(model, *args, **kwargs)
        after = {k: v.clone() for k, v in model.state_dict().items()}
        calls.append(dict(ft=ft, run=run, before=state, after=after, frozen=frozen))
        return out

    monkeypatch.setattr(ft_mod, "train_one_seed", recording)
    extra = ("finetune.probe_epochs=2", "finetune.probe_lr=0.05", "finetune.head_lr=0.002")
    cfg = _cfg(
        env, "finetune.encoder=albert", f"finetune.model={model_dir}", "finetune.vocab=", *extra
    )
    result = run_finetune(cfg, "tncc")
    assert result.system.endswith("+probe2")
    probe, tune = calls
    assert all(probe["frozen"]) and not any(tune["frozen"])
    assert (probe["ft"].epochs, probe["ft"].patience, probe["ft"].optimizer.lr) == (2, 2, 0.05)
    assert probe["ft"].head_lr == 0 and probe["ft"].probe_epochs == 0
    assert (tune["ft"].epochs, tune["ft"].head_lr) == (5, 0.002)
    assert isinstance(probe["run"], PrefixedRun) and probe["run"].prefix == "probe/"
    enc = [k for k in probe["before"] if k.startswith("encoder.")]
    head = [k for k in probe["before"] if k.startswith("head.")]
    assert enc and head
    assert all(torch.equal(probe["before"][k], probe["after"][k]) for k in enc)
    assert any(not torch.equal(probe["before"][k], probe["after"][k]) for k in head)
    # the fine-tuning starts from the probed head
    assert all(torch.equal(probe["after"][k], tune["before"][k]) for k in probe["after"])
    with pytest.raises(ConfigError, match=r"finetune.probe_epochs"):
        load_config(None, ["finetune.probe_epochs=1", "finetune.freeze_encoder=true"])
    with pytest.raises(ConfigError, match=r"finetune.probe_lr"):
        load_config(None, ["finetune.probe_lr=-1"])


def test_prefixed_run_prefixes_metric_names() -> None:
    logged: list = []
    run = SimpleNamespace(log_metrics=lambda m, step=None: logged.append((m, step)))
    PrefixedRun(run, "probe/").log_metrics({"eval/macro_f1": 0.5}, step=3)
    assert logged == [({"probe/eval/macro_f1": 0.5}, 3)]


def test_vocabulary_mismatch_and_ids_out_of_range(env) -> None:
    model_dir = _pretrained_dir(env)
    other = make_vocab(env.tmp / "other-vocab", size=50)
    cfg = _cfg(
        env, "finetune.encoder=albert", f"finetune.model={model_dir}", f"finetune.vocab={other}"
    )
    with pytest.raises(DataError, match="is not the one model"):
        run_finetune(cfg, "tncc")
    small = _pretrained_dir(env, vocab_size=10)
    cfg = _cfg(env, "finetune.encoder=albert", f"finetune.model={small}", "finetune.vocab=")
    with pytest.raises(DataError, match="ids would be out of range"):
        run_finetune(cfg, "tncc")


def test_rerun_resumes_finished_seeds(env) -> None:
    cfg = _cfg(env, "finetune.epochs=1")
    first = run_finetune(cfg, "tncc")
    weights = first.seeds[0].directory / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    again = run_finetune(cfg, "tncc")
    assert weights.stat().st_mtime_ns == stamp  # not retrained
    assert again.aggregate == first.aggregate
    changed = run_finetune(_cfg(env, "finetune.epochs=1", "finetune.dropout=0.2"), "tncc")
    assert weights.stat().st_mtime_ns != stamp  # another setting: trained again
    assert changed.seeds[0].metrics["test"].count == 30


def test_rerun_after_the_data_changed_trains_again(env) -> None:
    """The seed record held the splits' sizes, not their content: a corrected dataset with as
    many rows (here one training title relabelled) reused the seeds trained on the old one.
    A record from before the content hash is reused as before (what it saw is not known)."""
    cfg = _cfg(env, "finetune.epochs=1", "finetune.seeds=[1,2]")
    first = run_finetune(cfg, "tncc")
    one, two = (s.directory for s in first.seeds)
    stamps = [(d / "model.safetensors").stat().st_mtime_ns for d in (one, two)]
    record = json.loads((two / seeds_mod.SEED_FILE).read_text())
    record.pop("data_sha256")
    (two / seeds_mod.SEED_FILE).write_text(json.dumps(record))
    train = env.tmp / "data" / "tncc" / "tncc_title_train.jsonl"
    rows = [json.loads(line) for line in train.read_text("utf-8").splitlines()]
    assert rows[0]["label"] != rows[1]["label"]
    rows[0]["label"], rows[0]["label_id"] = rows[1]["label"], rows[1]["label_id"]  # relabelled
    train.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    run_finetune(cfg, "tncc")
    assert (one / "model.safetensors").stat().st_mtime_ns != stamps[0]  # trained again
    assert (two / "model.safetensors").stat().st_mtime_ns == stamps[1]  # the older record


def test_rerun_after_the_advts_labels_changed_scores_it_again(env) -> None:
    """A seed scored on AdvTS (--eval-also advts) records that set's content too: a relabelled
    AdvTS item scores the seed's classifier on it again (AdvTS is no part of its training);
    the same set is reused as it was scored."""
    cfg = _cfg(env, "finetune.epochs=1", "finetune.eval_also=[advts]")
    first = run_finetune(cfg, "tncc").seeds[0]
    weights = first.directory / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    run_finetune(cfg, "tncc")
    assert weights.stat().st_mtime_ns == stamp  # reused
    path = env.tmp / "data" / "advts" / "advts_tncc_title.jsonl"
    rows = [json.loads(line) for line in path.read_text("utf-8").splitlines()]
    other = next(r["label"] for r in rows if r["label"] != rows[0]["label"])
    rows[0]["label"] = other
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    again = run_finetune(cfg, "tncc").seeds[0]
    assert weights.stat().st_mtime_ns == stamp  # scored again, not trained
    assert again.metrics["advts"].targets != first.metrics["advts"].targets
    assert again.metrics["advts"].predictions == first.metrics["advts"].predictions
    assert again.metrics["test"] == first.metrics["test"]
    record = json.loads((first.directory / seeds_mod.SEED_FILE).read_text())
    assert record["metrics"]["advts"]["targets"] == again.metrics["advts"].targets


def _strip_predictions(seed_dir, macro_f1: float | None = None) -> None:
    """Rewrite a seed record as versions before item-level predictions wrote it."""
    path = seed_dir / seeds_mod.SEED_FILE
    record = json.loads(path.read_text())
    for m in record["metrics"].values():
        m.pop("targets"), m.pop("predictions")
        if macro_f1 is not None:
            m["summary"]["macro_f1"] = macro_f1
    path.write_text(json.dumps(record))


def test_rerun_rescores_a_seed_recorded_without_predictions(env) -> None:
    """An older finished seed gets its predictions from its saved classifier (not trained
    again), so `compare` can pair it; one whose classifier does not give the recorded scores
    is trained again."""
    cfg = _cfg(env, "finetune.epochs=1", "finetune.seeds=[1,2]", "finetune.eval_also=[advts]")
    first = run_finetune(cfg, "tncc")
    one, two = (s.directory for s in first.seeds)
    stamps = [(d / "model.safetensors").stat().st_mtime_ns for d in (one, two)]
    _strip_predictions(one)
    _strip_predictions(two, macro_f1=0.123)  # not what its classifier gives
    again = run_finetune(cfg, "tncc")
    assert (one / "model.safetensors").stat().st_mtime_ns == stamps[0]  # re-scored only
    assert (two / "model.safetensors").stat().st_mtime_ns != stamps[1]  # trained again
    for old, new in zip(first.seeds, again.seeds, strict=True):
        for part, m in old.metrics.items():
            assert new.metrics[part].predictions == m.predictions and m.predictions
            assert new.metrics[part].summary == pytest.approx(m.summary)
    kept = json.loads((one / seeds_mod.SEED_FILE).read_text())["metrics"]["test"]["predictions"]
    assert kept == first.seeds[0].metrics["test"].predictions  # written back
    row = json.loads((again.output / "results.json").read_text())
    assert compare_rows(row, row).diff == 0.0


def test_seed_fingerprint_holds_precision_not_speed_knobs(env) -> None:
    """A finished seed is reused only when the engine would train it the same way."""
    setup = ft_mod.prepare(_cfg(env), ft_mod.load_classification("tncc", "title"))

    def fingerprint(*extra: str) -> str:
        return seeds_mod.seed_fingerprint(setup, _cfg(env, *extra), 1, False)

    base = fingerprint()
    assert (
        len({base, fingerprint("engine.precision=fp32"), fingerprint("engine.precision=bf16")}) == 3
    )
    assert fingerprint("engine.threads=1", "engine.num_workers=3") == base


def test_seed_fingerprint_reads_pooling_as_resolved(env) -> None:
    """pooling's default became auto; on an encoder where auto reads as cls, a linear head's
    seeds fine-tuned under the old default keep their key, and cls_max still differs."""
    data = ft_mod.load_classification("tncc", "title")

    def fingerprint(*extra: str) -> str:
        cfg = _cfg(env, "finetune.encoder=albert", "finetune.head=linear", *extra)
        return seeds_mod.seed_fingerprint(ft_mod.prepare(cfg, data), cfg, 1, False)

    auto = fingerprint()
    assert auto == fingerprint("finetune.pooling=cls")
    assert auto != fingerprint("finetune.pooling=cls_max")


def test_cli_flags_become_config_overrides() -> None:
    from tibnlp.cli.finetune import _flags

    flags = _flags("none", "linear", None, "/v", "1,2,3", "advts")
    cfg = load_config(None, flags)
    assert cfg.finetune.model == "" and cfg.finetune.random_init
    assert cfg.finetune.head == "linear" and cfg.finetune.vocab == "/v"
    assert cfg.finetune.seeds == [1, 2, 3] and cfg.finetune.eval_also == ["advts"]


def test_empty_seeds_are_refused_and_empty_eval_also_clears() -> None:
    """`--seeds ""` ran the config's seeds as if the flag were absent; `--eval-also ""` could
    not turn off a config file's eval_also."""
    from tibnlp.cli.finetune import _flags

    with pytest.raises(ConfigError, match=r"'finetune.seeds': needs at least one seed"):
        load_config(None, _flags(None, None, None, None, "", None))
    cfg = load_config(
        None, ["finetune.eval_also=[advts]", *_flags(None, None, None, None, None, "")]
    )
    assert cfg.finetune.eval_also == []


def test_cli_document_task_error(env) -> None:
    from typer.testing import CliRunner

    from tibnlp.cli.main import app

    args = ["finetune", "tncc", "--task", "document", "--encoder", "none"]
    args += ["--vocab", str(env.vocab)]
    result = CliRunner().invoke(app, args)
    assert isinstance(result.exception, DataError)
    assert "FudanNLP" in (result.exception.hint or "")


def test_class_balance_weighs_the_loss_by_inverse_class_frequency(env, built) -> None:
    """finetune.class_balance: class c's loss weight is (N / (K n_c))^power, from the training
    labels read; the weighted loss is what the loop minimises."""
    from tibnlp.training.classification import ClassifierLoss, class_weights

    assert class_weights([0, 0, 0, 1], 3, 0.0) is None
    torch.testing.assert_close(class_weights([0, 0, 0, 1], 3, 1.0), torch.tensor([4 / 9, 4 / 3, 1]))
    half = class_weights([0, 0, 0, 1], 3, 0.5)
    assert half is not None
    torch.testing.assert_close(half, torch.tensor([(4 / 9) ** 0.5, (4 / 3) ** 0.5, 1.0]))
    result = run_finetune(_cfg(env, "finetune.epochs=1", "finetune.class_balance=1"), "tncc")
    assert result.system == "textcnn-pieces(scratch)+balance1"
    loss_module = built[-1][0]
    assert isinstance(loss_module, ClassifierLoss) and loss_module.class_weights is not None
    data = ft_mod.load_classification("tncc", "title")
    counts = np.bincount(data.targets("train"), minlength=len(data.labels))
    expected = counts.sum() / (len(data.labels) * counts)
    np.testing.assert_allclose(loss_module.class_weights.numpy(), expected, rtol=1e-6)
    ids, mask = torch.tensor([[2, 7, 3], [2, 8, 3]]), torch.ones(2, 3, dtype=torch.long)
    labels = torch.tensor([0, 1])
    logits = loss_module.model(ids, mask)
    weighted = torch.nn.functional.cross_entropy(logits, labels, weight=loss_module.class_weights)
    torch.testing.assert_close(loss_module(ids, mask, labels)["loss"], weighted)
    with pytest.raises(ConfigError, match=r"finetune.class_balance"):
        load_config(None, ["finetune.class_balance=2"])


def test_soup_fine_tunes_copies_from_one_start_and_keeps_their_greedy_average(
    env, monkeypatch
) -> None:
    """finetune.soup (model soups): after the probe, every copy fine-tunes from the same
    weights with its own seed and logs under soupK/; the saved classifier is the average of
    the copies the greedy soup kept, the best copy on validation among them."""
    from itertools import combinations

    from tibnlp.training.soup import average_states

    model_dir = _pretrained_dir(env)
    calls: list[dict] = []
    train = ft_mod.train_one_seed

    def recording(model, *args, **kwargs):
        before = {k: v.clone() for k, v in model.state_dict().items()}
        out = train(model, *args, **kwargs)
        after = {k: v.clone() for k, v in model.state_dict().items()}
        calls.append(dict(seed=args[5], run=args[6], before=before, after=after, val=out[2]))
        return out

    monkeypatch.setattr(ft_mod, "train_one_seed", recording)
    cfg = _cfg(
        env,
        "finetune.encoder=albert",
        f"finetune.model={model_dir}",
        "finetune.vocab=",
        "finetune.probe_epochs=1",
        "finetune.soup=3",
        "finetune.seeds=[2]",
        "finetune.epochs=2",
    )
    result = run_finetune(cfg, "tncc")
    assert result.system.endswith("+probe1+soup3")
    probe, *copies = calls
    assert [c["seed"] for c in copies] == [2, 2001, 2002]
    assert [c["run"].prefix for c in copies] == ["soup0/", "soup1/", "soup2/"]
    for c in copies:  # each copy starts from the probed weights
        assert all(torch.equal(probe["after"][k], c["before"][k]) for k in probe["after"])
    assert not all(
        torch.equal(copies[0]["after"][k], copies[1]["after"][k]) for k in probe["after"]
    )
    from safetensors.torch import load_file

    saved = load_file(str(result.seeds[0].directory / "model.safetensors"))
    best = max(range(3), key=lambda i: copies[i]["val"]["macro_f1"])
    matches = [
        kept
        for n in (1, 2, 3)
        for kept in combinations(range(3), n)
        if best in kept
        and all(
            torch.allclose(saved[k], v)
            for k, v in average_states([copies[i]["after"] for i in kept]).items()
            if k in saved
        )
    ]
    assert matches, "the saved classifier is no greedy soup of the copies"
    # the record scores what was saved: the soup, not the last copy
    assert result.seeds[0].metrics["validation"]["macro_f1"] >= copies[best]["val"]["macro_f1"]
    with pytest.raises(ConfigError, match=r"finetune.soup"):
        load_config(None, ["finetune.soup=0"])


def test_a_killed_soup_resumes_at_the_copy_it_was_training(env, monkeypatch) -> None:
    """Each finished copy of a soup is kept in the seed's folder: a rerun after a crash
    trains only the copies left (and the probe again), and ends with the classifier an
    uninterrupted run gives; the kept copies go when the classifier is saved."""
    from safetensors.torch import load_file

    from tibnlp.training.soup_run import SOUP_DIR

    model_dir = _pretrained_dir(env)
    seeds: list[int] = []
    train = ft_mod.train_one_seed

    def crashing(model, *args, **kwargs):
        seeds.append(args[5])
        if args[5] == 1002 and crash:
            raise KeyboardInterrupt  # killed while training copy 2
        return train(model, *args, **kwargs)

    monkeypatch.setattr(ft_mod, "train_one_seed", crashing)
    settings = (
        "finetune.encoder=albert",
        f"finetune.model={model_dir}",
        "finetune.vocab=",
        "finetune.probe_epochs=1",
        "finetune.soup=3",
        "finetune.epochs=2",
    )
    crash = True
    with pytest.raises(KeyboardInterrupt):
        run_finetune(_cfg(env, *settings), "tncc")
    seed_dir = next((env.tmp / "runs").rglob("seed-1"))
    kept = sorted(p.name for p in (seed_dir / SOUP_DIR).iterdir())
    assert kept == ["copy-0.pt", "copy-1.pt"] and not (seed_dir / "seed_result.json").exists()
    crash, seeds[:] = False, []
    resumed = run_finetune(_cfg(env, *settings), "tncc")
    assert seeds == [1, 1002]  # the probe (seed 1), then the copy left
    assert not (seed_dir / SOUP_DIR).exists()
    whole = run_finetune(_cfg(env, *settings, f"finetune.output={env.tmp / 'whole'}"), "tncc")
    a = load_file(str(resumed.seeds[0].directory / "model.safetensors"))
    b = load_file(str(whole.seeds[0].directory / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.seeds[0].metrics["test"].summary == whole.seeds[0].metrics["test"].summary


def test_a_soup_logs_each_copy_under_its_prefix_and_what_it_kept(env) -> None:
    """With MLflow on, a seed's run holds each copy's curves (soupK/...) and the soup's size
    and validation score beside the seed's usual metrics; TextCNN soups too."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{env.tmp / 'mlflow.db'}"
    tracking = [f"tracking.uri={uri}", "tracking.enabled=true"]
    result = run_finetune(_cfg(env, "finetune.soup=2", "finetune.epochs=2", *tracking), "tncc")
    assert result.system == "textcnn-pieces(scratch)+soup2"
    client = MlflowClient(uri)
    child = client.get_run(result.seeds[0].run_id).data.metrics
    assert {"soup0/eval/macro_f1", "soup1/eval/macro_f1", "test_macro_f1"} <= child.keys()
    assert child["soup/copies_kept"] in (1.0, 2.0)
    assert child["soup/val_macro_f1"] == pytest.approx(
        result.seeds[0].metrics["validation"]["macro_f1"]
    )
    assert child["soup/val_macro_f1"] >= child["soup/best_copy_val_macro_f1"]


def test_advts_labels_in_another_order_are_refused_with_what_to_do(env) -> None:
    """AdvTS scored with another label order would count every item against the wrong
    class: refused before any seed trains, saying which file to restore."""
    from tests.ft_fixtures import LABELS

    labels = env.tmp / "data" / "advts" / "labels.json"
    labels.write_text(json.dumps({"advts_tncc_title": {"labels": LABELS[::-1]}}), "utf-8")
    cfg = _cfg(env, "finetune.epochs=1", "finetune.eval_also=[advts]")
    with pytest.raises(DataError, match="AdvTS labels for tncc differ") as err:
        run_finetune(cfg, "tncc")
    assert "--eval-also advts" in err.value.hint and "tibnlp data list" in err.value.hint
    assert not (env.tmp / "runs").exists() or not list((env.tmp / "runs").rglob("seed-*"))


# ClassifierMeta's fields as a seed's key held them at 629c878: a field added to the meta
# enters every key, and so retrains every finished seed of every user, unless the key leaves
# it out (as text_field and label_field) or keeps the old key where it is unset (static_size).
KEYED_META_629C878 = {
    "encoder", "labels", "max_len", "vocab_sha256", "vocab_size", "head", "model",
    "embedding_size", "text_form", "join_spaced_syllables", "dataset", "source_model",
    "eval_routing", "reading", "format",
}  # fmt: skip


def test_a_seed_keeps_the_key_it_was_trained_under(env) -> None:
    """7e1ead9 recorded the record fields predict reads (text_field, label_field) in the
    classifier's meta, which the key hashed whole: every seed trained before was trained
    again. The fields name where the text came from; the data hash holds what was read."""
    import dataclasses

    from tibnlp.models.classifier_io import ClassifierMeta

    cfg = load_config(None, cfg_flags(env, "finetune.epochs=1"))
    setup = ft_mod.prepare(cfg, ft_mod.load_classification("tncc", "title"))
    key = seeds_mod.seed_fingerprint(setup, cfg, 1)
    setup.meta.text_field, setup.meta.label_field = "sentence", "category"
    assert seeds_mod.seed_fingerprint(setup, cfg, 1) == key
    added = {f.name for f in dataclasses.fields(ClassifierMeta)} - KEYED_META_629C878
    assert added == {"text_field", "label_field"}, f"decide whether {added} enter the key"
