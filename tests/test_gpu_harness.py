"""The GPU harness (`benchmarks/gpu/`) here: its CPU mode end to end, so it cannot rot between
device leases, and the bundle's pieces that need no network (closure walking, data subset,
size accounting, results sections)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from benchmarks.gpu import bundle, results
from benchmarks.gpu.speed import SpeedSettings

ROOT = Path(__file__).resolve().parent.parent


def _wheel(path: Path, name: str, version: str, requires: list[str]) -> Path:
    whl = path / f"{name}-{version}-py3-none-any.whl"
    meta = "\n".join(
        [f"Name: {name}", f"Version: {version}"] + [f"Requires-Dist: {r}" for r in requires]
    )
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr(f"{name}-{version}.dist-info/METADATA", meta + "\n")
    return whl


def test_requirements_follow_the_device_markers(tmp_path: Path) -> None:
    whl = _wheel(
        tmp_path,
        "demo",
        "1.0",
        [
            "alpha>=1",
            'beta; sys_platform == "win32"',
            'gamma; python_version < "3.12"',
            'delta; extra == "dev"',
            'epsilon; platform_machine == "x86_64"',
        ],
    )
    assert [r.name for r in bundle._requirements(whl)] == ["alpha", "epsilon"]


def test_closure_stops_at_the_device_image_and_substitutes_mlflow(tmp_path, monkeypatch) -> None:
    made = {
        "tibdemo": ["torch>=2", "mlflow>=2", "hjson"],
        "mlflow-skinny": ["pyyaml", "sqlparse"],
        "sqlalchemy": [],
        "alembic": ["sqlalchemy", "mako"],
        "hjson": [],
        "sqlparse": [],
        "mako": ["markupsafe"],
    }
    fetched = []

    def fake_download(name: str, version: str, wheels: Path) -> Path:
        fetched.append(name)
        return _wheel(wheels, name.replace("-", "_"), version, made[name])

    monkeypatch.setattr(bundle, "_download", fake_download)
    monkeypatch.setattr(bundle.md, "version", lambda name: "1.0")
    out = bundle.resolve(["tibdemo"], tmp_path)
    assert set(out.wheels) == set(made)  # torch, pyyaml, markupsafe: in the device image
    assert out.skipped["torch"] == "in the device image"
    assert out.skipped["mlflow"].startswith("replaced by mlflow-skinny")
    assert sorted(fetched) == sorted(made)  # each wheel fetched once


def test_data_subset_and_size_accounting(tmp_path, monkeypatch) -> None:
    data = tmp_path / "data"
    for sub, files in {
        "corpora": ["a.txt.xz", "SOURCES.md"],
        "tncc": ["labels.json", "SOURCE.md", "tncc_title_train.jsonl", "tncc_title.jsonl"],
        "wcm_bo": ["labels.json", "SOURCE.md", "wcm_bo_test.jsonl"],
    }.items():
        (data / sub).mkdir(parents=True)
        for f in files:
            (data / sub / f).write_text("x" * 1000)
    out = tmp_path / ".bundle"
    out.mkdir()
    members = bundle.pack_data(data, out / bundle.DATA_TAR)
    assert "tncc/tncc_title.jsonl" not in members  # the splits travel, not the whole file
    with tarfile.open(out / bundle.DATA_TAR) as tar:
        assert sorted(tar.getnames()) == sorted(members)
    (data / "tncc" / "labels.json").unlink()
    with pytest.raises(SystemExit, match=r"tncc/labels.json"):
        bundle.pack_data(data, out / bundle.DATA_TAR)
    monkeypatch.chdir(ROOT)
    total, table = bundle.size_report(out)
    assert total == bundle.tree_bytes() + (out / bundle.DATA_TAR).stat().st_size
    assert "total that travels" in table


def test_sections_replace_only_their_own_text(tmp_path: Path) -> None:
    path = tmp_path / "gpu.md"
    path.write_text("# GPU\n\nhand-written\n")
    results.update_section("speed", "first", path)
    results.update_section("check", "c", path)
    results.update_section("speed", "second", path)
    text = path.read_text()
    assert "hand-written" in text and "second" in text and "first" not in text
    assert text.index("gpu:speed") < text.index("gpu:check")
    out = tmp_path / "out"
    out.mkdir()
    results.write_part(out, "pretrain", "p")
    assert results.collect(out, path) == ["pretrain"]
    with pytest.raises(SystemExit, match="no section"):
        results.collect(tmp_path / "empty", path)


@pytest.mark.slow
def test_cpu_mode_runs_every_part(tmp_path: Path, require_data) -> None:
    """`run check speed pretrain curve loop finetune --cpu`: toy sizes, real code paths, real data;
    with --pack, the few files the device tool returns."""
    for name in ("corpora", "tncc", "wcm_bo"):
        require_data(name)
    out, work, pack = tmp_path / "out", tmp_path / "work", tmp_path / "pack"
    parts = ["check", "speed", "pretrain", "curve", "loop", "finetune"]
    cmd = [sys.executable, "-m", "benchmarks.gpu", "run", *parts, "--cpu"]
    cmd += ["--out", str(out), "--work", str(work), "--pack", str(pack)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for part in parts:
        assert "CPU mode" in (out / f"section-{part}.md").read_text()
        assert "FAILED" not in (out / f"section-{part}.md").read_text()
    check = json.loads((out / "check.json").read_text())
    assert check["pytest_exit"] == 0  # every gpu test skipped with its reason, none failed
    assert {r["design"] for r in check["kernels"]} >= {"dense", "multi-scale"}
    speed = json.loads((out / "speed.json").read_text())
    variants = {r["variant"] for r in speed["models"]}
    assert variants == {"transformers", "ours"}
    assert all(r["tokens_per_s"] > 0 and r["mfu"] > 0 for r in speed["models"])
    assert {r["design"] for r in speed["layers"]} == {
        "dense",
        "multi-scale",
        "multi-scale, FFN-free",
        "dynamic (8/12), batch rule",
    }
    assert {r["batch"] for r in speed["layers"]} == set(SpeedSettings.tiny().layer_batches)
    pre = json.loads((out / "pretrain.json").read_text())
    assert pre["facts"]["step"] == 3 and pre["parts"] == ["model.tar.part0"]
    assert (work / "pretrain" / "model").is_dir()
    # curve: the main job's two MLM stages from the pretrain part's model, every model back
    cur = json.loads((out / "curve.json").read_text())
    assert list(cur["facts"]) == ["corpus-tokens-512", "corpus-end", "titles-end"]
    assert cur["facts"]["corpus-end"]["tokens"] >= 1024
    assert cur["facts"]["titles-end"]["init_from"].endswith("model")
    assert "eval/mask_accuracy" in cur["metrics"]["titles-end"]
    # loop: the real step profiled over a window after warm-up
    profs = [json.loads((out / "loop" / f"v{i}" / "loop.json").read_text()) for i in range(7)]
    assert all(p["steps"] == 8 and p["window"] == 3 and p["step_ms_median"] > 0 for p in profs)
    assert profs[0]["ops_by_cpu"] and profs[0]["python"]
    assert profs[1]["threads"] == 2 and not profs[2]["prefetch"]
    assert profs[3]["batch_size"] == 4 * profs[0]["batch_size"]
    assert profs[4]["compile"] == "aot_eager" and profs[0]["compile"] == "off"
    assert profs[0]["zero_stage"] == 0 and profs[5]["zero_stage"] == 1
    assert profs[6]["deepspeed_clip"] and not profs[0]["deepspeed_clip"]
    # packed: the model parts and one tar of every small file
    names = sorted(p.name for p in pack.iterdir())
    assert names == ["curve.tar.part0", "model.tar.part0", "reports.tar"]
    with tarfile.open(pack / "reports.tar") as tar:
        names = set(tar.getnames())
        assert {
            "section-curve.md",
            "curve.json",
            "loop/v0/loop.json",
            "section-finetune.md",
        } <= names
    with tarfile.open(pack / "curve.tar.part0") as tar:
        assert "curve/titles-end/model.safetensors" in tar.getnames()
    fine = (out / "section-finetune.md").read_text()
    assert "macro" in fine.lower()
    assert set(json.loads((out / "finetune.json").read_text())["seconds"]) == {
        "tncc-title",
        "wcm-segments",
        "wcm-memory",
        "wcm-segments-twin",
    }


def test_a_failed_part_writes_its_error_and_the_next_still_runs(tmp_path, monkeypatch) -> None:
    from benchmarks.gpu import run as harness

    def broken(mode, env):
        raise SystemExit("curve: no start model in .bundle/start")

    monkeypatch.setitem(harness.PARTS, "curve", broken)
    monkeypatch.setitem(harness.PARTS, "check", lambda mode, env: "all well")
    mode = harness.Mode(True, tmp_path / "out", tmp_path / "work", pack=tmp_path / "pack")
    assert harness.run(["curve", "check"], mode) == 1
    assert (
        "FAILED**: SystemExit: curve: no start model"
        in (tmp_path / "out" / "section-curve.md").read_text()
    )
    assert "all well" in (tmp_path / "out" / "section-check.md").read_text()
    with tarfile.open(tmp_path / "pack" / "reports.tar") as tar:
        assert sorted(tar.getnames()) == ["section-check.md", "section-curve.md"]


def test_loop_variants_are_picked_by_index() -> None:
    from benchmarks.gpu.run import pick_variants

    variants = {"as configured": 0, "2 threads": 1, "no prefetch": 2, "batch 256": 3}
    assert [i for i, _ in pick_variants(variants, "")] == [0, 1, 2, 3]
    assert pick_variants(variants, "3,0") == [(0, ("as configured", 0)), (3, ("batch 256", 3))]
    for bad in ("4", "x", ","):
        with pytest.raises(SystemExit, match="0: as configured, 1: 2 threads"):
            pick_variants(variants, bad)


def test_check_reports_pytests_tally_not_the_exit_warning() -> None:
    from benchmarks.gpu.run import pytest_summary

    log = "tests/a.py ....\n=== 27 passed, 51 warnings in 153.45s (0:02:33) ===\n"
    log += "[rank0]: Warning: destroy_process_group() was not called\n"
    assert pytest_summary(log) == "27 passed, 51 warnings in 153.45s (0:02:33)"
    assert pytest_summary("ImportError: no torch\n") == "ImportError: no torch"


def test_curve_rates_count_the_stage_alone(tmp_path: Path) -> None:
    """Facts count from the chain's first stage (the skip-gram start's seconds included): the
    curve's table subtracts the model each stage continued."""
    import torch
    from safetensors.torch import save_file

    from benchmarks.gpu.run import stage_run

    start = tmp_path / "start"
    start.mkdir()
    extra = {"tokens": 7396, "train_seconds": 438.2}
    save_file(
        {"w": torch.zeros(1)}, str(start / "model.safetensors"), {"tibnlp_extra": json.dumps(extra)}
    )
    facts = {"tokens": 39.45e6, "continued_tokens": 39.44e6, "train_seconds": 678.2}
    assert stage_run({**facts, "init_from": str(start)}) == (39.44e6, pytest.approx(240.0))
    gone = str(tmp_path / "elsewhere")  # the device's path, read here: nothing to subtract
    assert stage_run({**facts, "init_from": gone}) == (39.44e6, 678.2)


@pytest.mark.slow
def test_wide_part_runs_the_pipeline_and_returns_both_results(tmp_path: Path, require_data) -> None:
    """`run wide --cpu`: pipelines/gpu_wide.yaml at toy sizes; the fine-tuned and the twin's
    results.json (per-seed predictions, for `finetune compare` here) and the title stage's
    model come back packed."""
    for name in ("corpora", "tncc"):
        require_data(name)
    out, work, pack = tmp_path / "out", tmp_path / "work", tmp_path / "pack"
    cmd = [sys.executable, "-m", "benchmarks.gpu", "run", "wide", "--cpu"]
    cmd += ["--out", str(out), "--work", str(work), "--pack", str(pack)]
    cmd += ["--set", "pretrain.seed=3"]  # an override passed through to the pipeline
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    wide = json.loads((out / "wide.json").read_text())
    assert set(wide["facts"]) == {"pretrain", "adapt"}
    assert wide["facts"]["adapt"]["init_from"].endswith("model")
    assert "eval/mask_accuracy" in wide["metrics"]["pretrain"]
    assert wide["parts"] == ["wide-model.tar.part0"]
    for stage, init in (("finetune", "pretrained"), ("twin", "random")):
        res = json.loads((out / "wide-results" / stage / "results.json").read_text())
        assert res["seeds"][0]["predictions"]["test"] and res["targets"]["test"], stage
        assert f"albert-{init}" in res["system"], stage
    section = (out / "section-wide.md").read_text()
    assert "| pretrain |" in section and "vs random init" in section
    assert "pretrain.seed=3" in section
    assert sorted(p.name for p in pack.iterdir()) == ["reports.tar", "wide-model.tar.part0"]
    with tarfile.open(pack / "wide-model.tar.part0") as tar:
        assert "wide-model/model.safetensors" in tar.getnames()


def test_wide_until_stops_the_pipeline_on_the_device(tmp_path: Path, monkeypatch) -> None:
    """`run wide --until adapt` (an H100 lease is too short for the whole pipeline): the
    pipeline gets `--until adapt`, the part's section says so, and with no fine-tuning run no
    results are claimed."""
    from benchmarks.gpu import run

    seen: list[list[str]] = []

    def fake(args: list[str], env: dict[str, str], log: Path) -> float:
        seen.append(args)
        log.write_text("pipeline gpu_wide: pretrained only\n")
        return 1.0

    monkeypatch.setattr(run, "_tibnlp", fake)
    mode = run.Mode(False, tmp_path / "out", tmp_path / "work", minutes=2.0, until="adapt")
    mode.out.mkdir()
    text = run.wide(mode, {})
    (args,) = seen
    assert args[args.index("--until") + 1] == "adapt"
    assert "--set=vars.budget=120s" in args
    assert "--until adapt" in text and "no fine-tuning on the device" in text
    assert not (mode.out / "wide-results").exists()


_KILLED_PART = """
import sys, time
from pathlib import Path
from benchmarks.gpu import __main__ as cli, run as harness

def slow(mode, env):  # a part that has logged, then outlives its `timeout` in lease.sh
    (mode.out / "slow.log").write_text("step 1 of 100\\n")
    (mode.out / "started").touch()
    time.sleep(60)
    return "finished"

harness.PARTS["check"] = slow
harness.PARTS["speed"] = lambda mode, env: "must not run after a kill"
sys.exit(cli.main(sys.argv[1:]))
"""


def test_a_part_killed_by_its_timeout_still_packs_what_it_wrote(tmp_path: Path) -> None:
    """lease.sh runs each part under `timeout`, which sends SIGTERM: the part's log and a section
    saying it was cut must reach --pack (the device's $OUT), and no later part starts."""
    import signal
    import time

    out, pack = tmp_path / "out", tmp_path / "pack"
    cmd = [sys.executable, "-c", _KILLED_PART, "run", "check", "speed", "--cpu"]
    cmd += ["--out", str(out), "--work", str(tmp_path / "work"), "--pack", str(pack)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + 60
    while not (out / "started").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert (pack / "reports.tar").exists(), "the killed part packed nothing"
    with tarfile.open(pack / "reports.tar") as tar:
        assert {"slow.log", "section-check.md"} <= set(tar.getnames())
        section = tar.extractfile("section-check.md").read().decode()  # type: ignore[union-attr]
    assert "FAILED" in section and "SIGTERM" in section
    assert not (out / "section-speed.md").exists()


def test_a_failing_speed_block_keeps_the_blocks_before_it(tmp_path, monkeypatch) -> None:
    """The eager table `emit` wrote must survive a later block's error (the compiled half)."""
    from benchmarks.gpu import run as harness
    from benchmarks.gpu import speed as speed_mod

    def fake_run_speed(settings, emit):
        emit("| 128 | 256 | ours | 2,000,000 |", {"models": [1]})
        raise RuntimeError("inductor: compiled multi-scale at batch 64 failed")

    monkeypatch.setattr(speed_mod, "run_speed", fake_run_speed)
    mode = harness.Mode(True, tmp_path / "out", tmp_path / "work", pack=tmp_path / "pack")
    assert harness.run(["speed"], mode) == 1
    section = (tmp_path / "out" / "section-speed.md").read_text()
    assert "FAILED" in section and "compiled multi-scale" in section
    assert "| 128 | 256 | ours | 2,000,000 |" in section


def test_pretrain_part_passes_the_set_overrides(tmp_path: Path, monkeypatch) -> None:
    """`run pretrain --set KEY=VALUE` (lease.sh's ARGS): the overrides reach `tibnlp pretrain`
    as they reach the curve and wide pipelines, instead of being dropped without a word."""
    from benchmarks.gpu import run

    seen: list[list[str]] = []

    def fake(args: list[str], env: dict[str, str], log: Path) -> float:
        seen.append(args)
        if args[0] == "pretrain":
            raise SystemExit("stop here: the command is what this test reads")
        return 1.0

    monkeypatch.setenv("TIBNLP_DATA", str(tmp_path / "data"))
    monkeypatch.setattr(run, "_tibnlp", fake)
    mode = run.Mode(False, tmp_path / "out", tmp_path / "work", minutes=2.0)
    mode.sets = ["pretrain.seed=2", "pretrain.batch_size=128"]
    mode.out.mkdir()
    mode.work.mkdir()
    with pytest.raises(SystemExit, match="stop here"):
        run.pretrain(mode, {})
    args = seen[-1]
    assert args[0] == "pretrain"
    given = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    assert given[-2:] == ["pretrain.seed=2", "pretrain.batch_size=128"]  # last: they win


def test_collect_takes_the_section_of_every_part(tmp_path: Path) -> None:
    """Every part `run` writes a section for (wide included) is one `collect` puts in gpu.md."""
    from benchmarks.gpu import run

    out = tmp_path / "out"
    out.mkdir()
    for part in run.PARTS:
        results.write_part(out, part, f"section of {part}")
    path = tmp_path / "gpu.md"
    assert set(results.collect(out, path)) == set(run.PARTS)
    assert "section of wide" in path.read_text()


def test_lease_splits_the_cores_the_machine_grants() -> None:
    """lease.sh pins the part and `check` to cores of their own: split from the cores this
    process may use, not a hard-coded 0-9 / 10-15 that fails on another core count."""
    from benchmarks.gpu.cores import split

    assert split(range(16)) == ("0-9", "10-15", 6)  # the lent machines: as before
    assert split(range(8)) == ("0-4", "5-7", 3)
    assert split(range(16, 32)) == ("16-25", "26-31", 6)  # a cpuset not starting at 0
    assert split([0, 2, 4, 6]) == ("0,2,4", "6", 1)
    assert split([3]) == ("", "", 1)  # one core: no pinning, both share it
    lease = (ROOT / "benchmarks" / "gpu" / "lease.sh").read_text()
    assert "benchmarks.gpu.cores" in lease and "taskset -c 0-9" not in lease
    assert subprocess.run(["bash", "-n", str(ROOT / "benchmarks/gpu/lease.sh")]).returncode == 0
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu.cores"], cwd=ROOT, capture_output=True, text=True
    )
    env: dict[str, str] = {}
    for word in done.stdout.split():
        key, value = word.split("=", 1)
        env[key] = value
    assert set(env) == {"PART_CPUS", "CHECK_CPUS", "CHECK_THREADS"}
    assert int(env["CHECK_THREADS"]) >= 1


def test_speed_blocks_are_checked_when_the_settings_are_made() -> None:
    with pytest.raises(ValueError, match="name some of"):
        SpeedSettings("cpu", blocks=("layers", "compiled-everything"))
    with pytest.raises(ValueError, match="need compile ours or all"):
        SpeedSettings("cpu", compile="none", blocks=("compiled-layers",))


def test_compiled_layers_alone_run_in_sub_blocks_each_emitted(monkeypatch) -> None:
    """`--blocks compiled-layers` (a lease that has the eager figures): no model rows, the
    largest batch first, each design group against dense emitted as it ends, so a lease cut
    while inductor compiles keeps the groups before."""
    from benchmarks.gpu import speed as speed_mod
    from benchmarks.gpu import timing

    calls: list[tuple[bool, tuple[int, ...] | None, tuple[str, ...] | None]] = []

    def fake_layers(s, compiled, n=512, batches=None, names=None):
        calls.append((compiled, batches, names))
        row = {"n": n, "batch": batches[0], "design": "dense", "compiled": compiled, "ms": 1.0}
        return [row | {"vs_dense": 1.0}]

    def no_models(*args, **kwargs):
        raise AssertionError("model rows were not asked for")

    monkeypatch.setattr(speed_mod, "layer_rows", fake_layers)
    monkeypatch.setattr(speed_mod, "model_rows", no_models)
    monkeypatch.setattr(timing, "matmul_peak", lambda device, n: 1e12)
    emitted: list[int] = []
    settings = SpeedSettings("cpu", layer_batches=(16, 64), blocks=("compiled-layers",))
    speed_mod.run_speed(settings, lambda text, payload: emitted.append(len(payload["layers"])))
    groups = speed_mod.COMPILED_GROUPS
    assert calls == [(True, (b,), g) for b in (64, 16) for g in groups]
    assert emitted == list(range(1, len(calls) + 1))


def test_layer_rows_keep_dense_as_the_base_of_a_named_group() -> None:
    from benchmarks.gpu.speed import layer_rows

    rows = layer_rows(SpeedSettings.tiny(), False, names=("dynamic (8/12), batch rule",))
    assert [r["design"] for r in rows] == ["dense", "dynamic (8/12), batch rule"]
    assert rows[0]["vs_dense"] == 1.0 and rows[1]["ms"] > 0


def _model_dir(path: Path, max_len: int) -> Path:
    import yaml

    from tibnlp.config.core import to_dict
    from tibnlp.config.model import ModelConfig

    path.mkdir(parents=True)
    (path / "model.yaml").write_text(yaml.safe_dump(to_dict(ModelConfig(max_len=max_len))))
    return path


def test_finetune_readings_fill_the_models_rows(tmp_path: Path) -> None:
    """Every WCM-bo reading feeds rows of the model's max_len; memory's window and budget
    pass the check fine-tuning itself applies (so a lease does not find the error)."""
    from benchmarks.gpu.run import finetune_runs
    from tibnlp.config.finetune import FinetuneConfig, GlobalMemoryConfig
    from tibnlp.models.io import load_config_file
    from tibnlp.training.long_documents import reading_of

    model = _model_dir(tmp_path / "m", 128)
    runs = finetune_runs(model, cpu=False)
    assert list(runs) == [
        "wcm-truncate",
        "wcm-segments",
        "wcm-memory",
        "wcm-truncate-twin",
        "wcm-segments-twin",
        "tncc-title",
    ]
    assert runs["wcm-segments-twin"] == [*runs["wcm-segments"], "--set", "finetune.init=random"]
    # the title run reads the states the README main job's does, from its pipeline file
    from benchmarks.gpu.run import main_job_finetune
    from tibnlp.config.yaml_loader import parse_override

    layers = [parse_override(a)[1] for a in runs["tncc-title"] if a.startswith("finetune.layers=")]
    assert layers == [main_job_finetune()["layers"]]

    def value(args: list[str], key: str) -> str:
        return [a.split("=", 1)[1] for a in args if a.startswith(key + "=")][-1]

    assert value(runs["wcm-segments"], "finetune.max_len") == "128"
    window = int(value(runs["wcm-memory"], "finetune.max_len"))
    budget = int(value(runs["wcm-memory"], "finetune.global_memory.budget"))
    assert (window, budget) == (96, 31)
    ft = FinetuneConfig(
        model=str(model),
        long_document="memory",
        max_len=window,
        global_memory=GlobalMemoryConfig(budget=budget),
    )
    assert reading_of(ft, load_config_file(model), window).memory.budget == 31
    assert list(finetune_runs(model, cpu=True)) == [
        "wcm-segments",
        "wcm-memory",
        "wcm-segments-twin",
        "tncc-title",
    ]


def test_finetune_part_keeps_the_runs_done_when_one_fails(tmp_path, monkeypatch) -> None:
    """A failed fine-tuning is recorded in the section and the next still runs; each finished
    run's results.json (per-seed predictions) travels back in OUT."""
    from benchmarks.gpu import run

    model = _model_dir(tmp_path / "model", 128)

    def fake(args: list[str], env: dict[str, str], log: Path) -> float:
        target = Path(next(a for a in args if a.startswith("finetune.output=")).split("=", 1)[1])
        if "finetune.long_document=segments" in args:
            raise SystemExit("run: `tibnlp finetune classify` failed: CUDA out of memory")
        (target / "wcm_bo" / "sys").mkdir(parents=True)
        (target / "wcm_bo" / "sys" / "results.json").write_text("{}")
        return 2.0

    monkeypatch.setattr(run, "_tibnlp", fake)
    monkeypatch.setattr(run, "find_model", lambda mode: model)
    real_text, reported = run._finetune_text, []

    def text_without_report(seeds, sec, failed, outs, env):  # type: ignore[no-untyped-def]
        reported[:] = outs  # the last call's; the fakes' results.json hold no tables to report
        return real_text(seeds, sec, failed, [], env)

    monkeypatch.setattr(run, "_finetune_text", text_without_report)
    mode = run.Mode(False, tmp_path / "out", tmp_path / "work", pack=tmp_path / "pack")
    mode.out.mkdir()
    mode.work.mkdir()
    text = run.finetune(mode, {})
    assert "**wcm-segments FAILED**" in text and "CUDA out of memory" in text
    assert "wcm-memory 2 s" in text and "tncc-title 2 s" in text
    finished = ["tncc-title", "wcm-memory", "wcm-truncate", "wcm-truncate-twin"]
    assert sorted(Path(o).name for o in reported) == finished  # reported, the failed ones not
    facts = json.loads((mode.out / "finetune.json").read_text())
    assert "wcm-memory" in facts["seconds"] and "tncc-title" in facts["seconds"]
    assert list(facts["failed"]) == ["wcm-segments", "wcm-segments-twin"]
    assert (mode.out / "finetune" / "wcm-memory" / "wcm_bo" / "sys" / "results.json").exists()
    assert (tmp_path / "pack" / "reports.tar").exists()


def test_finetune_part_cut_by_its_time_limit_keeps_the_runs_before(tmp_path, monkeypatch) -> None:
    """The seventh lease's finetune part was cut in its fifth run and its section said only
    that it was killed: the runs that finished must stay in it."""
    from benchmarks.gpu import run

    model = _model_dir(tmp_path / "model", 128)

    def fake(args: list[str], env: dict[str, str], log: Path) -> float:
        if "finetune.long_document=segments" in args:
            raise run.Terminated("killed by SIGTERM (its time limit); files so far packed")
        return 2.0

    monkeypatch.setattr(run, "_tibnlp", fake)
    monkeypatch.setattr(run, "find_model", lambda mode: model)
    monkeypatch.setattr(
        run, "_finetune_text", lambda seeds, sec, failed, outs, env: f"report of {list(sec)}"
    )
    mode = run.Mode(False, tmp_path / "out", tmp_path / "work")
    monkeypatch.setattr(run, "install", lambda: {})
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    assert run.run(["finetune"], mode) == 1
    section = (mode.out / "section-finetune.md").read_text()
    assert "killed by SIGTERM" in section and "during wcm-segments or its report" in section
    assert "report of ['wcm-truncate']" in section


def test_finetune_runs_are_picked_by_name(tmp_path: Path) -> None:
    """`run finetune --runs wcm-segments-twin,tncc-title`: a lease finishes what the last one's
    time limit cut, in the part's order; an unknown name is refused with the names there are."""
    from benchmarks.gpu.run import finetune_runs, pick_runs

    runs = finetune_runs(_model_dir(tmp_path / "m", 128), cpu=False)
    assert pick_runs(runs, "") == runs
    assert list(pick_runs(runs, "tncc-title, wcm-segments-twin")) == [
        "wcm-segments-twin",
        "tncc-title",
    ]
    with pytest.raises(SystemExit, match="give names among wcm-truncate"):
        pick_runs(runs, "wcm-sgements")


def test_finetune_part_cut_in_a_report_keeps_the_runs_before(tmp_path, monkeypatch) -> None:
    """The limit may come while `finetune report` runs after a fine-tuning (as on the seventh
    lease): the section still holds the report of the runs before, and their results.json."""
    from benchmarks.gpu import run

    model = _model_dir(tmp_path / "model", 128)
    reports: list[list[str]] = []

    def fake(args: list[str], env: dict[str, str], log: Path) -> float:
        target = Path(next(a for a in args if a.startswith("finetune.output=")).split("=", 1)[1])
        (target / "sys").mkdir(parents=True)
        (target / "sys" / "results.json").write_text("{}")
        return 2.0

    def text(seeds, sec, failed, outs, env) -> str:
        if len(sec) == 2:
            raise run.Terminated("killed by SIGTERM (its time limit); files so far packed")
        reports.append(list(sec))
        return f"report of {list(sec)}"

    monkeypatch.setattr(run, "_tibnlp", fake)
    monkeypatch.setattr(run, "find_model", lambda mode: model)
    monkeypatch.setattr(run, "_finetune_text", text)
    monkeypatch.setattr(run, "install", lambda: {})
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    mode = run.Mode(False, tmp_path / "out", tmp_path / "work")
    assert run.run(["finetune"], mode) == 1
    section = (mode.out / "section-finetune.md").read_text()
    assert "during wcm-segments or its report" in section
    assert "report of ['wcm-truncate']" in section
    assert (mode.out / "finetune" / "wcm-segments" / "sys" / "results.json").exists()


def test_install_unpacks_a_new_data_tar_on_a_reused_machine(tmp_path, monkeypatch) -> None:
    """A machine kept warm between calls holds the last bundle's data; a bundle whose data
    changed must be unpacked again, not read stale."""
    from benchmarks.gpu import run

    monkeypatch.setattr(run, "DEVICE_DATA", tmp_path / "device-data")
    for name in ("TIBNLP_DATA", "PYTHONPATH"):  # install sets both for the process: restored
        monkeypatch.setenv(name, os.environ.get(name, ""))  # records the value (or none)
        if not os.environ[name]:
            monkeypatch.delenv(name)
    bundle_dir = tmp_path / "bundle"
    bundle_dir.mkdir()

    def pack(text: str) -> None:
        (tmp_path / "corpus.txt").write_text(text)
        with tarfile.open(bundle_dir / bundle.DATA_TAR, "w:xz") as tar:
            tar.add(tmp_path / "corpus.txt", arcname="corpora/corpus.txt")

    pack("first")
    env = run.install(bundle_dir)
    assert env["TIBNLP_DATA"] == str(tmp_path / "device-data")
    assert (tmp_path / "device-data" / "corpora" / "corpus.txt").read_text() == "first"
    pack("second, longer")
    run.install(bundle_dir)
    assert (tmp_path / "device-data" / "corpora" / "corpus.txt").read_text() == "second, longer"
