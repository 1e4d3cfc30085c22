"""`tibnlp pretrain` on the real model and data code, on a tiny synthetic Tibetan corpus:
end to end, and SIGKILL + `--resume` against an uninterrupted run (bit-identical on CPU)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file
from tibetan_fixtures import TINY_MODEL, prepared_inputs, pretrain_config_file

from tibnlp.config import load_config
from tibnlp.errors import ConfigError
from tibnlp.models import read_extra
from tibnlp.text.vocab import Vocabulary
from tibnlp.tracking.orphans import LEDGER
from tibnlp.training import checkpoint

TINY = {
    "model": {**TINY_MODEL, "num_layers": 2},
    "pretrain": {
        "seq_len": 48,
        "batch_size": 8,
        "max_steps": 12,
        "eval_every": 6,
        "eval_batches": 2,
        "log_every": 2,
        "checkpoint_every": 4,
    },
    "engine": {"threads": 1},
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepared_inputs(tmp_path_factory.mktemp("pretrain_inputs"), n_docs=200, heldout=30)


def _config_file(inputs: Path, out: Path, **pretrain: object) -> Path:
    return pretrain_config_file(inputs, out, TINY, experiment="pt-tests", **pretrain)


def test_pretrain_end_to_end(inputs: Path, tmp_path: Path) -> None:
    from tibnlp.training.pretrain import run_pretraining

    out = tmp_path / "run"
    model_dir = run_pretraining(load_config(_config_file(inputs, out)))
    assert model_dir == out / "model"
    saved = yaml.safe_load((model_dir / "model.yaml").read_text())
    assert saved["vocab_size"] == Vocabulary.load(inputs / "vocab").size
    assert isinstance(saved["heads"]["threshold"], int)  # "auto" became the median length
    assert Vocabulary.load(model_dir).sha256 == Vocabulary.load(inputs / "vocab").sha256
    assert load_file(model_dir / "model.safetensors")
    assert checkpoint.latest_tag(out / "checkpoints") == "step00000012"

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("pt-tests").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.params["pretrain.batch_size"] == "8"
    assert run.data.tags["vocab.sha256"] == Vocabulary.load(inputs / "vocab").sha256
    assert "data.median_length" in run.data.tags
    for split in ("train", "eval"):
        for name in ("loss", "mask_loss", "mask_accuracy", "sop_loss", "sop_accuracy"):
            assert f"{split}/{name}" in run.data.metrics
    assert "lr" in run.data.metrics and "tokens_per_s" in run.data.metrics
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "vocabulary", "model"} <= artifacts


def test_mlm_only_run_exports_its_learning_curve(inputs: Path, tmp_path: Path) -> None:
    from tibnlp.training.pretrain import run_pretraining

    out = tmp_path / "mlm"
    cfg = _config_file(inputs, out, sop=False, export_at_tokens=[500, 2000])
    model_dir = run_pretraining(load_config(cfg))
    final = read_extra(model_dir)
    assert final["stopped_by"] == "max_steps" and final["tokens"] > 2000
    assert {"hardware", "train_seconds", "flops_per_token", "processes"} <= final.keys()
    steps = [read_extra(out / "exports" / n)["step"] for n in ("tokens-500", "tokens-2000")]
    assert 0 < steps[0] < steps[1] <= 12
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("pt-tests").experiment_id])
    assert "train/mask_loss" in run.data.metrics
    assert not any("sop" in k for k in run.data.metrics)  # no sentence-order head


def test_pretraining_with_the_contrast_logs_it_and_leaves_the_head_behind(
    inputs: Path, tmp_path: Path
) -> None:
    from tibnlp.training.pretrain import run_pretraining

    out = tmp_path / "contrast"
    cfg = _config_file(inputs, out, sop=False, contrastive=1.0, max_steps=4)
    model_dir = run_pretraining(load_config(cfg))
    saved = load_file(model_dir / "model.safetensors")
    assert any(k.startswith("contrastive_proj.") for k in saved)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("pt-tests").experiment_id])
    for split in ("train", "eval"):
        assert f"{split}/contrastive_loss" in run.data.metrics
        assert f"{split}/contrastive_accuracy" in run.data.metrics
    # continued without the contrast (the title stage): the head is left behind, not refused
    after = tmp_path / "after"
    cfg2 = _config_file(inputs, after, sop=False, max_steps=2, init_from=str(model_dir))
    continued = run_pretraining(load_config(cfg2))
    assert not any(k.startswith("contrastive_") for k in load_file(continued / "model.safetensors"))


def test_word_table_gets_its_own_learning_rate(inputs: Path, tmp_path: Path, built) -> None:
    """pretrain.word_lr: the word-piece table (the MLM decoder's tied weight) at its own
    peak rate, every other parameter at optimizer.lr; refused when negative."""
    from tibnlp.training.pretrain import run_pretraining

    out = tmp_path / "held"
    cfg = _config_file(inputs, out, sop=False, max_steps=2, word_lr=1e-5)
    run_pretraining(load_config(cfg, ["pretrain.optimizer.lr=0.001"]))
    model, optimizer = built[-1]
    rate = {id(p): g["initial_lr"] for g in optimizer.param_groups for p in g["params"]}
    named = dict(model.named_parameters())
    assert rate[id(named["encoder.embeddings.word.weight"])] == 1e-5
    others = {rate[id(p)] for n, p in named.items() if n != "encoder.embeddings.word.weight"}
    assert others == {0.001}
    with pytest.raises(ConfigError, match=r"pretrain.word_lr"):
        load_config(None, ["pretrain.word_lr=-1"])


def test_init_from_continues_a_model_with_its_own_shape(inputs: Path, tmp_path: Path) -> None:
    """Continued (task-adaptive) pretraining: the run starts from the named model's weights
    and shape, whatever its own model section says, and may drop the sentence-order head."""
    import torch

    from tibnlp.training.pretrain import run_pretraining

    first = run_pretraining(load_config(_config_file(inputs, tmp_path / "a")))
    cfg = load_config(
        _config_file(inputs, tmp_path / "b", sop=False, max_steps=2, init_from=str(first))
    )
    cfg.pretrain.vocab = str(first)  # a model directory carries its vocabulary
    cfg.model.hidden_size = 48  # ignored: the shape comes from init_from
    cfg.pretrain.optimizer.lr = 1e-9  # two steps that cannot move the weights measurably
    cfg.pretrain.optimizer.warmup_steps = 0
    second = run_pretraining(cfg)
    assert yaml.safe_load((second / "model.yaml").read_text())["hidden_size"] == 32
    # the new run's weights, not the init directory's files copied along with its vocabulary
    facts, start = read_extra(second), read_extra(first)
    assert facts["step"] == 2 and start["step"] == 12
    # compute is counted from scratch: the start's tokens and FLOPs plus the continuation's
    assert 0 < facts["continued_tokens"] < facts["tokens"]
    assert facts["tokens"] == start["tokens"] + facts["continued_tokens"]
    assert facts["flops"] > start["flops"] and facts["init_from"] == str(first)
    before, after = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    assert set(after) == {k for k in before if not k.startswith("sop_")}
    for key, value in after.items():
        torch.testing.assert_close(value, before[key], rtol=0, atol=1e-6)
    fresh = run_pretraining(
        load_config(_config_file(inputs, tmp_path / "c", sop=False, max_steps=2))
    )
    other = load_file(fresh / "model.safetensors")
    assert any(not torch.equal(other[k], before[k]) for k in other)  # a fresh start differs


def test_a_new_run_ends_the_run_a_killed_one_left_open_in_its_folder(
    inputs: Path, tmp_path: Path
) -> None:
    """Killed before its first checkpoint, a run is started again without --resume: the dead
    process's MLflow run, still RUNNING, is ended KILLED (the SIGKILL and the note are
    `test_pretrain_sigkill_and_resume_match_an_uninterrupted_run`'s)."""
    from tibnlp.tracking.orphans import open_run
    from tibnlp.training.pretrain import run_pretraining

    out = tmp_path / "run"
    cfg = load_config(_config_file(inputs, out, max_steps=2))
    client = MlflowClient(cfg.tracking.uri)
    dead = client.create_run(client.create_experiment("pt-tests")).info.run_id
    out.mkdir()
    open_run(out, dead, cfg.tracking.uri)  # what the killed process left
    run_pretraining(cfg)
    assert client.get_run(dead).info.status == "KILLED"
    runs = client.search_runs([client.get_experiment_by_name("pt-tests").experiment_id])
    assert sorted(r.info.status for r in runs) == ["FINISHED", "KILLED"]
    assert not (out / LEDGER).exists()


def test_pretraining_without_tracking_or_with_a_late_failure_leaves_no_ledger(
    inputs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tracking off: no run, so nothing is noted (a disabled tracker has no store). A failure
    after training (writing the model): the run ends FAILED and its note goes with it."""
    from tibnlp.training import pretrain_record
    from tibnlp.training.pretrain import run_pretraining

    off = tmp_path / "off"
    cfg = load_config(_config_file(inputs, off, max_steps=2), ["tracking.enabled=false"])
    assert run_pretraining(cfg) == off / "model"
    assert (off / "model" / "model.safetensors").is_file() and not (off / LEDGER).exists()

    def boom(*_args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(pretrain_record.RunRecord, "final_model", boom)
    late = tmp_path / "late"
    cfg = load_config(_config_file(inputs, late, max_steps=2))
    with pytest.raises(OSError, match="disk full"):
        run_pretraining(cfg)
    client = MlflowClient(cfg.tracking.uri)
    (run,) = client.search_runs([client.get_experiment_by_name("pt-tests").experiment_id])
    assert run.info.status == "FAILED" and not (late / LEDGER).exists()


def test_eval_only_scores_a_model_as_its_run_last_did(inputs: Path, tmp_path: Path) -> None:
    """`--eval-only`: the held-out evaluation of a finished model, no step taken; it equals
    the run's own last evaluation (same held-out rows, same fixed masks, same weights)."""
    import json

    from tibnlp.training.pretrain import run_pretraining

    model_dir = run_pretraining(load_config(_config_file(inputs, tmp_path / "a", sop=False)))
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("pt-tests").experiment_id])
    last = {
        m.step: m.value for m in client.get_metric_history(run.info.run_id, "eval/mask_accuracy")
    }
    cfg = load_config(_config_file(inputs, tmp_path / "b", sop=False, init_from=str(model_dir)))
    cfg.pretrain.vocab = str(model_dir)
    out = run_pretraining(cfg, eval_only=True)
    scores = json.loads(out.read_text("utf-8"))
    assert out == tmp_path / "b" / "eval.json" and scores["rows"] == 2 * 8
    assert scores["eval/mask_accuracy"] == pytest.approx(last[12], abs=1e-6)
    assert 0 < scores["eval/unigram_accuracy"] < 1 and "eval/mask_loss" in scores
    assert not (tmp_path / "b" / "checkpoints").exists() and not (tmp_path / "b" / "model").exists()
    with pytest.raises(ConfigError, match="--eval-only scores a model"):
        run_pretraining(load_config(_config_file(inputs, tmp_path / "c")), eval_only=True)


def test_eval_only_tokenises_only_the_held_out_split(
    inputs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--eval-only` scores the held-out split, so it tokenises that split alone: no training
    text is encoded (it tokenised the whole corpus, train split included, before)."""
    import json

    import datasets

    from tibnlp.training.pretrain import run_pretraining

    model_dir = run_pretraining(load_config(_config_file(inputs, tmp_path / "a", max_steps=2)))
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("pt-tests").experiment_id])
    last = client.get_metric_history(run.info.run_id, "eval/mask_accuracy")[-1].value

    corpus = datasets.load_from_disk(str(inputs / "corpus" / "dataset"))
    text = {s: {t for doc in corpus[s]["sentences"] for t in doc} for s in ("train", "heldout")}
    train_only = text["train"] - text["heldout"]
    assert train_only
    encoded: list[str] = []
    real = Vocabulary.encode_batch

    def spy(self: Vocabulary, texts: list[str], num_threads: int = -1) -> list[list[int]]:
        encoded.extend(texts)
        return real(self, texts, num_threads)

    monkeypatch.setattr(Vocabulary, "encode_batch", spy)
    cfg = load_config(_config_file(inputs, tmp_path / "b", init_from=str(model_dir)))
    cfg.pretrain.vocab = str(model_dir)
    cfg.engine.num_workers = 1  # tokenise in this process, where the spy is
    scores = json.loads(run_pretraining(cfg, eval_only=True).read_text("utf-8"))
    assert encoded and set(encoded) <= text["heldout"]
    assert not set(encoded) & train_only
    assert scores["eval/mask_accuracy"] == pytest.approx(last, abs=1e-6)  # same rows, masks


def test_eval_only_flag_reaches_the_run(monkeypatch) -> None:
    from typer.testing import CliRunner

    from tibnlp.cli.main import app
    from tibnlp.training import pretrain as pretrain_mod

    seen = {}
    monkeypatch.setattr(
        pretrain_mod, "run_pretraining", lambda cfg, **kw: seen.update(kw) or Path("x/eval.json")
    )
    out = CliRunner().invoke(app, ["pretrain", "--eval-only"])
    assert out.exit_code == 0, out.output
    assert seen == {"resume": False, "wait": False, "eval_only": True}
    assert "scores: x/eval.json" in out.output


def test_init_from_with_another_vocabulary_is_refused(inputs: Path, tmp_path: Path) -> None:
    from tibnlp.training.pretrain import run_pretraining

    first = run_pretraining(load_config(_config_file(inputs, tmp_path / "a", max_steps=2)))
    other = prepared_inputs(tmp_path / "other", n_docs=120, heldout=20, vocab_size=150)
    cfg = load_config(_config_file(other, tmp_path / "b", init_from=str(first)))
    with pytest.raises(ConfigError, match=r"init_from.*another vocabulary") as err:
        run_pretraining(cfg)
    assert "pretrain.vocab=" in str(err.value.hint)
    assert not (tmp_path / "b" / "model").exists()


def test_missing_inputs_are_a_config_error() -> None:
    from tibnlp.training.pretrain import run_pretraining

    with pytest.raises(ConfigError, match=r"pretrain\.corpus"):
        run_pretraining(load_config(None, []))


def test_batch_the_processes_cannot_split_is_refused_before_tokenising(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """32 sequences over 3 processes (torchrun's WORLD_SIZE): refused at once, before the
    process group, the output folder and the corpus's tokenising (minutes on a real corpus)."""
    import torch.distributed

    from tibnlp.training import pretrain

    def past_the_check(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the run went on past the batch-size check")

    monkeypatch.setattr(pretrain, "init_distributed", past_the_check)
    monkeypatch.setattr(pretrain, "build_pretraining_dataset", past_the_check)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    out = tmp_path / "out"
    sets = ["pretrain.corpus=c", "pretrain.vocab=v", f"pretrain.output={out}"]
    with pytest.raises(ConfigError, match=r"'pretrain\.batch_size': 32 .* 3 processes"):
        pretrain.run_pretraining(load_config(None, [*sets, "pretrain.batch_size=32"]))
    assert not out.exists()


def _cli(config: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "tibnlp.cli.main", "pretrain", "-c", str(config), *args]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("settings", "extra"),
    [
        ({}, "eval/sop_accuracy"),
        # two networks, one tied embedding and the generator's sampling to restore
        ({"objective": "electra", "sop": False, "mask_prob": 0.3}, "eval/rtd_accuracy"),
    ],
    ids=["mlm", "electra"],
)
def test_pretrain_sigkill_and_resume_match_an_uninterrupted_run(
    inputs: Path, tmp_path: Path, settings: dict[str, object], extra: str
) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path.cwd()), *sys.path])}
    steps = {
        "max_steps": 40,
        "checkpoint_every": 4,
        "eval_every": 10,
        "export_at_tokens": [1000, 4000, 9000],  # before, around and after the kill
        **settings,
    }
    killed_cfg = _config_file(inputs, tmp_path / "killed", **steps)
    log = (tmp_path / "killed.log").open("w")
    proc = subprocess.Popen(_cli(killed_cfg), env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    try:
        # kill after the first checkpoint at step 8 or later: waiting for that one tag alone
        # raced a loaded machine, where the poll could miss it and the run then finished
        while int((checkpoint.latest_tag(tmp_path / "killed" / "checkpoints") or "step0")[4:]) < 8:
            assert proc.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert not (tmp_path / "killed" / "model").exists()
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (dead,) = client.search_runs([client.get_experiment_by_name("pt-tests").experiment_id])
    assert dead.info.status == "RUNNING"  # nothing ended it
    assert (tmp_path / "killed" / LEDGER).is_file()  # but the folder names it
    subprocess.run(_cli(killed_cfg, "--resume"), env=env, check=True, capture_output=True)
    assert client.get_run(dead.info.run_id).info.status == "FINISHED"  # ended, then resumed
    assert not (tmp_path / "killed" / LEDGER).exists()
    straight_cfg = _config_file(inputs, tmp_path / "straight", **steps)
    subprocess.run(_cli(straight_cfg), env=env, check=True, capture_output=True)

    a = load_file(tmp_path / "killed" / "model" / "model.safetensors")
    b = load_file(tmp_path / "straight" / "model" / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert (a[key] == b[key]).all(), key
    for name in ("tokens-1000", "tokens-4000", "tokens-9000"):
        ea = load_file(tmp_path / "killed" / "exports" / name / "model.safetensors")
        eb = load_file(tmp_path / "straight" / "exports" / name / "model.safetensors")
        assert all((ea[k] == eb[k]).all() for k in ea), name
        facts = read_extra(tmp_path / "straight" / "exports" / name)
        assert facts["tokens"] >= int(name.split("-")[1]) and facts["flops"] > 0
    runs = client.search_runs([client.get_experiment_by_name("pt-tests").experiment_id])
    assert len(runs) == 2  # the resumed process continued the killed one's run
    by_name = {r.info.run_name: r for r in runs}
    for key in ("train/loss", "train/mask_accuracy", "eval/loss", extra):
        assert by_name["killed"].data.metrics[key] == by_name["straight"].data.metrics[key], key


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in folder.rglob("*")
        if p.is_file()
    }


@pytest.mark.slow
def test_second_pretrain_on_a_held_folder_refuses_and_writes_nothing(
    inputs: Path, tmp_path: Path
) -> None:
    """Run A is paused mid-run (SIGSTOP: alive, holding its folder); `pretrain --resume` on
    the same folder refuses at once naming A and touches no file; A then finishes alone."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path.cwd()), *sys.path])}
    out = tmp_path / "run"
    cfg = _config_file(inputs, out, max_steps=16, checkpoint_every=4, eval_every=8)
    log = (tmp_path / "a.log").open("w")
    a = subprocess.Popen(_cli(cfg), env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    try:
        while checkpoint.latest_tag(out / "checkpoints") is None:
            assert a.poll() is None, (tmp_path / "a.log").read_text()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(a.pid, signal.SIGSTOP)
        try:
            before = _snapshot(out)
            b = subprocess.run(
                _cli(cfg, "--resume"), env=env, capture_output=True, text=True, timeout=600
            )
            assert _snapshot(out) == before
        finally:
            os.kill(a.pid, signal.SIGCONT)
        said = " ".join((b.stdout + b.stderr).split())
        assert b.returncode == 3, said
        assert f"{out} is in use by process {a.pid}" in said
        assert a.wait(timeout=600) == 0, (tmp_path / "a.log").read_text()[-3000:]
    finally:
        if a.poll() is None:
            a.kill()
        a.wait()
    assert checkpoint.latest_tag(out / "checkpoints") == "step00000016"
    assert load_file(out / "model" / "model.safetensors")
    assert not (out / ".tibnlp.lock").exists()
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("pt-tests").experiment_id])
    assert [r.info.status for r in runs] == ["FINISHED"]  # the refused run opened none


def test_a_resumed_run_does_not_warn_again(
    inputs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The learning check warns once per run: its verdict rides in the checkpoint, so a run
    resumed (here for more steps) does not print and tag the warning a second time."""
    from tibnlp.training import pretrain

    monkeypatch.setattr(pretrain, "unigram_accuracy", lambda *a: 0.99)  # never past it
    out = tmp_path / "run"
    short = _config_file(inputs, out, max_steps=8, eval_every=4, warn_after=0.1)
    pretrain.run_pretraining(load_config(short))
    assert capsys.readouterr().err.count("is not learning") == 1
    longer = _config_file(inputs, out, max_steps=12, eval_every=4, warn_after=0.1)
    pretrain.run_pretraining(load_config(longer), resume=True)
    assert "is not learning" not in capsys.readouterr().err


def test_resume_with_another_model_shape_is_refused_before_config_yaml_changes(
    inputs: Path, tmp_path: Path
) -> None:
    """A shape changed on --resume is named (the key, both values) before the run's
    config.yaml is written over; with that file gone, the load itself says the checkpoint
    holds another model instead of printing DeepSpeed's state-dict traceback."""
    from tibnlp.errors import TibnlpError
    from tibnlp.training.pretrain import run_pretraining

    out = tmp_path / "a"
    path = _config_file(inputs, out, max_steps=4)
    run_pretraining(load_config(path))
    saved = (out / "config.yaml").read_text()
    wider = ["model.hidden_size=48", "pretrain.max_steps=6"]
    with pytest.raises(ConfigError, match=r"model\.hidden_size 48 \(saved: 32\)") as err:
        run_pretraining(load_config(path, wider), resume=True)
    assert str(out / "config.yaml") in str(err.value.hint)
    assert (out / "config.yaml").read_text() == saved

    (out / "config.yaml").unlink()
    with pytest.raises(TibnlpError, match=r"step00000004 holds another model") as err2:
        run_pretraining(load_config(path, wider), resume=True)
    assert "size mismatch" in err2.value.message
    # with its own shape it continues
    run_pretraining(load_config(path, ["pretrain.max_steps=6"]), resume=True)
    assert checkpoint.latest_tag(out / "checkpoints") == "step00000006"
