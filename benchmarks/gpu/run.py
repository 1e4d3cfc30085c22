"""`run PART`: what runs on the lent GPU machine, one command of at most 10 minutes per part.

- check: installs the bundle, reports the environment, the SDPA kernel each attention design
  gets, and runs `pytest -m gpu`.
- speed: benchmarks/gpu/speed.py.
- pretrain: corpus prepare + vocabulary + pretraining at the paper shape (ALBERT-tiny, seq 512,
  batch 256, LAMB) under a wall-clock budget, bf16; the model lands in WORK/pretrain/model and,
  split in parts of at most 15 MiB, in OUT (so a later lease can carry it back).
- curve: pipelines/gpu_curve.yaml: the main job's MLM stages far past the CPU's budget, from
  the skip-gram start carried in .bundle/start; its models come back for fine-tuning here.
- finetune: that model (pretrain's, else curve's, else one carried in .bundle) with the main
  job's recipe on WCM-bo documents (truncate, segments and memory readings, and the random-init
  twin of the first two), then TNCC titles, 3 seeds each; the `finetune report` tables.

`--cpu` runs every part at toy sizes on the CPU (a test in the suite does, so the harness cannot
rot between leases). Each part writes OUT/section-PART.md and OUT/PART.json; `collect` puts
the sections into benchmarks/results/gpu.md. A part that fails writes its error as its section
and the next part still runs. `--pack DIR` (the device's $OUT, which returns at most 8 files)
gathers the small files into DIR/reports.tar after every part and moves the model parts there.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import lzma
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks.gpu import results, timing
from benchmarks.gpu.bundle import BUNDLE, DATA_TAR

SITE = Path("/tmp/tibnlp-site")  # device: where the wheels are installed (--target)
DEVICE_DATA = Path("/tmp/tibnlp-data")
PART_BYTES = 15 * 2**20  # the device tool returns files of at most 16 MiB
CPU_CORPUS = "tibetan_tibetanqa_encyclopedia.txt.xz"  # the smallest raw corpus (CPU mode)
CPU_LINES = 600  # CPU mode reads its first lines only


@dataclass
class Mode:
    cpu: bool
    out: Path
    work: Path
    minutes: float = 5.0  # pretraining budget on the device (pretrain, curve)
    tokens: float = 60e6  # curve: the corpus stage's token budget
    compile: str = "ours"  # speed: none | ours | all
    blocks: tuple[str, ...] = ()  # speed: the blocks to run (speed.BLOCKS); empty: all
    pack: Path | None = None
    variants: str = ""  # loop: the variants to run, by index ("0,3"); empty: all
    sets: list[str] = field(default_factory=list)  # pretrain, curve, wide, finetune: overrides
    until: str = ""  # wide: the last pipeline stage run on the device (empty: all)
    runs: str = ""  # finetune: the runs to make, by name ("wcm-segments-twin,tncc-title"); all

    @property
    def device(self) -> str:
        return "cpu" if self.cpu else "cuda"


def install(bundle: Path = BUNDLE) -> dict[str, str]:
    """Device: the bundle's wheels into SITE and its data into DEVICE_DATA (once per machine);
    returns the environment every child process gets."""
    env = dict(os.environ)
    wheels = sorted((bundle / "wheels").glob("*.whl"))
    if wheels:
        marker = SITE / ".installed"
        names = "\n".join(w.name for w in wheels)
        if not marker.exists() or marker.read_text() != names:
            cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
            cmd += ["--no-compile", "--upgrade", "--target", str(SITE), *map(str, wheels)]
            subprocess.run(cmd, check=True)
            marker.write_text(names)
        sys.path.insert(0, str(SITE))
    data = bundle / DATA_TAR
    if data.exists():
        unpacked = DEVICE_DATA / ".unpacked"  # which tar it holds: a new bundle unpacks again
        stamp = hashlib.sha256(data.read_bytes()).hexdigest()
        if not unpacked.exists() or unpacked.read_text() != stamp:
            shutil.rmtree(DEVICE_DATA, ignore_errors=True)
            with tarfile.open(data) as tar:
                tar.extractall(DEVICE_DATA, filter="data")
            unpacked.write_text(stamp)
        env["TIBNLP_DATA"] = str(DEVICE_DATA)
    repo = str(Path.cwd())
    paths = [str(SITE)] if wheels else []
    env["PYTHONPATH"] = os.pathsep.join([*paths, repo, env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep
    )
    env["PYTHONUNBUFFERED"] = "1"
    os.environ.update({k: env[k] for k in ("PYTHONPATH", "TIBNLP_DATA") if k in env})
    return env


def _tibnlp(args: list[str], env: dict[str, str], log: Path) -> float:
    """`tibnlp ARGS` in a child process (output to `log`); seconds it took. Fails loudly."""
    t0 = time.perf_counter()
    with log.open("a") as fh:
        fh.write(f"$ tibnlp {' '.join(args)}\n")
        fh.flush()
        cmd = [sys.executable, "-m", "tibnlp.cli.main", *args]
        done = subprocess.run(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT)
    if done.returncode:
        tail = log.read_text()[-3000:]
        raise SystemExit(f"run: `tibnlp {' '.join(args)}` failed (see {log}):\n{tail}")
    return time.perf_counter() - t0


# ---- check -------------------------------------------------------------------------------
def environment() -> dict[str, Any]:
    import torch

    facts: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
    }
    if torch.cuda.is_available():
        facts["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
        facts["memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    for name in ("deepspeed", "mlflow", "datasets", "transformers", "triton", "sentencepiece"):
        try:
            facts[name] = importlib.import_module(name).__version__
        except Exception as exc:  # the report says what is missing instead of stopping
            facts[name] = f"not importable: {type(exc).__name__}: {exc}"[:160]
    return facts


def pytest_summary(output: str) -> str:
    """pytest's closing tally ("27 passed, 51 warnings in 153.45s"), not whatever a process
    printed after it (NCCL's exit warnings); the last line when there is none."""
    lines = output.strip().splitlines() or ["(no output)"]
    tallies = [ln for ln in lines if re.search(r"\d+ (passed|failed|error|skipped|deselected)", ln)]
    return (tallies or lines)[-1].strip("= ")


def check(mode: Mode, env: dict[str, str]) -> str:
    from benchmarks.gpu import kernels

    facts = environment()
    rows = kernels.report(mode.device, seq=32 if mode.cpu else 128)
    junit = mode.out / "pytest-gpu.xml"
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", f"--junitxml={junit}"]
    cmd += ["tests/test_gpu.py", "tests/test_gpu_engine.py", "-p", "no:cacheprovider"]
    if importlib.util.find_spec("pytest_timeout"):  # one hung CUDA test must not eat the lease
        cmd.append("--timeout=150")
    log = mode.out / "pytest-gpu.log"
    with log.open("w") as fh:  # streamed: a part killed at the lease's limit still shows it
        done = subprocess.run(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, text=True)
    output = log.read_text()
    summary = pytest_summary(output)
    lines = ["Environment:", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in facts.items()]
    lines += ["", f"`pytest -m gpu` (exit {done.returncode}): {summary}", ""]
    lines += [f"SDPA kernels by design ({mode.device}, bf16 autocast on CUDA):", ""]
    lines.append(kernels.markdown(rows))
    _dump(mode, "check", {"environment": facts, "pytest_exit": done.returncode, "kernels": rows})
    if done.returncode not in (0, 5):  # 5: nothing collected/selected
        print(output[-6000:], file=sys.stderr)
    return "\n".join(lines)


# ---- pretrain ----------------------------------------------------------------------------
PAPER = {  # pipelines/paper_tiny.yaml's pretraining, with a warm-up sized to minutes
    "engine": {"precision": "bf16", "zero_stage": 0, "num_workers": 8},  # LAMB: no ZeRO
    "pretrain": {
        "seq_len": 512,
        "batch_size": 256,
        "micro_batch_size": 64,
        "max_steps": 125000,
        "log_every": 50,
        "eval_every": 500,
        "eval_batches": 20,
        "checkpoint_every": 10**6,  # none inside a lease: the budget ends the run
        "optimizer": {"name": "lamb", "lr": 0.00176, "warmup_steps": 200, "schedule": "linear"},
    },
}
TINY = {
    "engine": {"precision": "fp32", "zero_stage": 0, "threads": 2},
    "model": {
        "hidden_size": 32,
        "embedding_size": 16,
        "ffn_size": 64,
        "num_layers": 2,
        "max_len": 256,  # memory reading: [CLS] + 128 memory + [SEP] + the window
        "heads": {"small": 4, "large": 4},
    },
    "pretrain": {
        "seq_len": 32,
        "batch_size": 8,
        "max_steps": 3,
        "log_every": 1,
        "eval_every": 3,
        "eval_batches": 1,
        "checkpoint_every": 3,
        "optimizer": {"lr": 0.001, "warmup_steps": 1},
    },
}


def _config_file(mode: Mode, name: str, extra: dict[str, Any]) -> Path:
    import yaml

    base = json.loads(json.dumps(TINY if mode.cpu else PAPER))
    for section, values in extra.items():
        base.setdefault(section, {}).update(values)
    path = mode.work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(base, sort_keys=False))
    return path


def _split_into(src: Path, out: Path, stem: str) -> list[str]:
    """`src` folder as a tar cut into parts the device tool can return."""
    tar_path = out / f"{stem}.tar"
    with tarfile.open(tar_path, "w") as tar:
        tar.add(src, arcname=stem)
    names = []
    with tar_path.open("rb") as fh:
        for i, chunk in enumerate(iter(lambda: fh.read(PART_BYTES), b"")):
            part = out / f"{stem}.tar.part{i}"
            part.write_bytes(chunk)
            names.append(part.name)
    tar_path.unlink()
    return names


def pretrain(mode: Mode, env: dict[str, str]) -> str:
    from mlflow.tracking import MlflowClient

    from tibnlp.data.datadir import data_dir
    from tibnlp.models.io import read_extra

    data = data_dir() / "corpora"
    log = mode.out / "pretrain.log"
    inputs = [data]
    if mode.cpu:
        inputs = [_toy_corpus(mode)]
    log.unlink(missing_ok=True)
    corpus, vocab, output = (mode.work / n for n in ("corpus", "vocab", "pretrain"))
    for old in (corpus, vocab, output):  # each part starts from nothing
        shutil.rmtree(old, ignore_errors=True)
    ins = [a for p in inputs for a in ("--input", str(p))]
    t_prep = _tibnlp(
        ["corpus", "prepare", *ins, "--output", str(corpus), "--force", "--no-progress"], env, log
    )
    size = "300" if mode.cpu else "30000"
    t_vocab = _tibnlp(
        ["vocab", "build", "--corpus", str(corpus), "--output", str(vocab), "--vocab-size", size],
        env,
        log,
    )
    uri = f"sqlite:///{mode.work / 'mlflow.db'}"
    cfg = _config_file(
        mode,
        "pretrain",
        {"pretrain": {"corpus": str(corpus), "vocab": str(vocab), "output": str(output)}},
    )
    budget = [] if mode.cpu else ["--time-budget", f"{mode.minutes:g}m"]
    # --set KEY=VALUE (lease.sh's ARGS) reaches the run as in curve and wide, last so it wins
    sets = [a for x in [f"tracking.uri={uri}", *mode.sets] for a in ("--set", x)]
    with timing.busy_share(mode.device, every_s=1.0) as busy:
        t_train = _tibnlp(["pretrain", "-c", str(cfg), *budget, *sets], env, log)
    model = output / "model"
    facts = read_extra(model)
    run = MlflowClient(uri).get_run(facts["mlflow_run_id"])
    metrics = {k: v for k, v in run.data.metrics.items() if k.startswith(("eval/", "train/"))}
    parts = _split_into(model, mode.out, "model")
    tokens_s = facts["tokens"] / max(facts["train_seconds"], 1e-9)
    _dump(mode, "pretrain", {"facts": facts, "metrics": metrics, "busy": busy, "parts": parts})
    lines = [
        f"Corpus prepare {t_prep:.0f} s, vocabulary {t_vocab:.0f} s, pretraining command "
        f"{t_train:.0f} s (budget {'none, CPU mode' if mode.cpu else f'{mode.minutes:g} min'}"
        + (f"; {' '.join(mode.sets)}" if mode.sets else "")
        + ").",
        "",
        "| step | tokens | train s | tokens/s | stopped by | GPU busy (NVML) | hardware |",
        "|---:|---:|---:|---:|---|---:|---|",
        f"| {facts['step']} | {facts['tokens']:,.0f} | {facts['train_seconds']:.0f} | "
        f"{tokens_s:,.0f} | {facts.get('stopped_by', '')} | {100 * busy['busy']:.0f}% | "
        f"{facts.get('hardware', '')} |",
        "",
        "Last logged metrics: "
        + ", ".join(f"{k} {v:.4g}" for k, v in sorted(metrics.items()))
        + ".",
        "",
        f"Model directory: WORK/pretrain/model, returned as {', '.join(parts)}.",
    ]
    return "\n".join(lines)


# ---- curve -------------------------------------------------------------------------------
CURVE_PIPELINE = Path("pipelines/gpu_curve.yaml")
START = BUNDLE / "start"  # the skip-gram start (vectors_proxy.yaml's pretrain model), carried


def _start(mode: Mode, part: str) -> Path:
    """The model the curve and loop parts continue: the carried skip-gram start on the device,
    the pretrain part's toy model in CPU mode."""
    start = mode.work / "pretrain" / "model" if mode.cpu else START
    if not (start / "model.safetensors").exists():
        raise SystemExit(
            f"{part}: no start model in {start} (device: copy vectors_proxy.yaml's pretrain "
            "model directory to .bundle/start before `bundle`; CPU mode: run pretrain first)"
        )
    return start.resolve()


def _curve_models(work: Path) -> dict[str, Path]:
    """name -> model directory: the corpus stage's exports, its end, the title stage's end."""
    found: dict[str, Path] = {}
    for out in sorted((work / "pretrain").glob("out-*/model")):
        for export in sorted(out.glob("exports/tokens-*"), key=lambda p: float(p.name[7:])):
            found[f"corpus-{export.name}"] = export
        found["corpus-end"] = out / "model"
    for out in sorted((work / "adapt").glob("out-*/model")):
        found["titles-end"] = out / "model"
    return found


def stage_run(extra: dict[str, Any]) -> tuple[float, float]:
    """(tokens, seconds) of the stage that wrote a model: its facts count from the first
    stage of the chain (the skip-gram start's seconds included), so the model it continued
    (`init_from`, read when it is still there) is subtracted."""
    from tibnlp.models.io import read_extra

    tokens = float(extra.get("continued_tokens", extra.get("tokens", 0)))
    seconds = float(extra.get("train_seconds", 0))
    parent = Path(str(extra.get("init_from", "")))
    if extra.get("init_from") and (parent / "model.safetensors").exists():
        seconds -= float(read_extra(parent).get("train_seconds", 0))
    return tokens, seconds


def _stage_metrics(uri: str, facts: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """model name -> the last eval/* metrics of the MLflow run that wrote it (the stages' ends;
    the tracking store stays on the device, so the section carries them)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    found: dict[str, dict[str, float]] = {}
    for name, extra in facts.items():
        run_id = extra.get("mlflow_run_id")
        if run_id:
            values = client.get_run(run_id).data.metrics
            found[name] = {k: v for k, v in values.items() if k.startswith("eval/")}
    return found


def _command_line(pipeline: Path, sets: list[str], seconds: float, busy: dict) -> str:
    return (
        f"`tibnlp pipeline run {pipeline}` ({' '.join(sets)}): {seconds:.0f} s, "
        f"GPU busy (NVML, whole command) {100 * busy['busy']:.0f}%."
    )


def _metric_lines(metrics: dict[str, dict[str, float]]) -> list[str]:
    return [
        f"Last held-out metrics, {name}: "
        + ", ".join(f"{k} {v:.4g}" for k, v in sorted(values.items()))
        + "."
        for name, values in metrics.items()
    ]


def curve(mode: Mode, env: dict[str, str]) -> str:
    from tibnlp.models.io import read_extra

    work = mode.work / "curve"
    shutil.rmtree(work, ignore_errors=True)
    log = mode.out / "curve.log"
    log.unlink(missing_ok=True)
    uri = f"sqlite:///{mode.work / 'mlflow.db'}"
    sets = [f"tracking.uri={uri}"]
    start = _start(mode, "curve")
    if mode.cpu:  # the pretrain part's toy model as the start, the toy corpus, a few steps
        sets += [f"vars.corpora=[{_toy_corpus(mode)}]", "vars.tokens=1024", 'vars.budget=""']
        sets += ["vars.exports=[512]", "vars.adapt_tokens=512", "engine.precision=fp32"]
        sets += ["engine.zero_stage=0"]
        sets += ["engine.threads=2", "pretrain.batch_size=8", "vars.batch=8", "pretrain.seq_len=32"]
    else:
        sets += [f"vars.tokens={mode.tokens:.0f}", f"vars.budget={mode.minutes * 60:.0f}s"]
        sets += ["engine.num_workers=8"]
    sets += mode.sets
    args = ["pipeline", "run", str(CURVE_PIPELINE), "--workdir", str(work), "--tracking-uri", uri]
    args += [f"--set=vars.start={start}", *(f"--set={x}" for x in sets)]
    with timing.busy_share(mode.device, every_s=1.0) as busy:
        seconds = _tibnlp(args, env, log)
    models = _curve_models(work)
    rows, facts = [], {}
    for name, path in models.items():
        extra = read_extra(path)
        facts[name] = extra
        tokens, seconds_in = stage_run(extra)
        rows.append(
            f"| {name} | {extra.get('step', '')} | {tokens:,.0f} | {seconds_in:.0f} | "
            f"{tokens / max(seconds_in, 1e-9):,.0f} | {extra.get('stopped_by', '')} |"
        )
    metrics = _stage_metrics(uri, facts)
    staged = mode.work / "curve-models"
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir()
    for name, path in models.items():
        shutil.copytree(path, staged / name)
    parts = _split_into(staged, mode.out, "curve")
    _dump(
        mode,
        "curve",
        {"facts": facts, "metrics": metrics, "busy": busy, "parts": parts, "seconds": seconds},
    )
    lines = [
        _command_line(CURVE_PIPELINE, sets[1:], seconds, busy),
        "",
        "| model | step | stage tokens | stage s | tokens/s | stopped by |",
        "|---|---:|---:|---:|---:|---|",
        *rows,
        "",
        *_metric_lines(metrics),
        "",
        f"Models returned as {', '.join(parts)} (a tar of the folder curve-models/).",
    ]
    return "\n".join(lines)


# ---- wide --------------------------------------------------------------------------------
WIDE_PIPELINE = Path("pipelines/gpu_wide.yaml")
WIDE_CPU = {  # toy sizes: the stages' code paths, not a measurement
    "vars.tokens": "1024",
    "vars.budget": '""',
    "vars.adapt_tokens": "512",
    "vars.batch": "8",
    "vars.vocab_size": "300",
    "engine.precision": "fp32",
    "engine.zero_stage": "0",
    "engine.threads": "2",
    "engine.num_workers": "0",
    "model.hidden_size": "32",
    "model.embedding_size": "16",
    "model.ffn_size": "64",
    "model.num_layers": "2",
    "model.heads": "{small: 4, large: 4}",
    "pretrain.seq_len": "32",
    "finetune.seeds": "[1]",
    "finetune.epochs": "1",
    "finetune.limit_train": "64",
    "finetune.cnn_channels": "8",
    "finetune.max_len": "32",
}


def _stage_out(work: Path, stage: str) -> Path | None:
    """The newest output folder of a pipeline stage (None: the stage never finished)."""
    outs = sorted((work / stage).glob("out-*"), key=lambda p: p.stat().st_mtime)
    return outs[-1] if outs else None


def wide(mode: Mode, env: dict[str, str]) -> str:
    """pipelines/gpu_wide.yaml end to end: the main job at the paper's width on all nine
    corpora, fine-tuned on TNCC titles beside its random-init twin; the results.json files
    (predictions included, for `finetune compare` here) and the title stage's model come back.
    The models are packed even when a later stage fails."""
    from tibnlp.models.io import read_extra

    work = mode.work / "wide"
    shutil.rmtree(work, ignore_errors=True)
    log = mode.out / "wide.log"
    log.unlink(missing_ok=True)
    uri = f"sqlite:///{mode.work / 'mlflow.db'}"
    sets = [f"tracking.uri={uri}"]
    if mode.cpu:
        sets += [f"vars.corpora=[{_toy_corpus(mode)}]"]
        sets += [f"{k}={v}" for k, v in WIDE_CPU.items()]
    else:
        sets += [f"vars.budget={mode.minutes * 60:.0f}s"]
    sets += mode.sets
    args = ["pipeline", "run", str(WIDE_PIPELINE), "--workdir", str(work), "--tracking-uri", uri]
    # --until adapt: pretrain on the device, fine-tune here (an H100 call is too short for the
    # whole pipeline: gpu_wide.md)
    until = ["--until", mode.until] if mode.until else []
    args += [f"--set={x}" for x in sets] + until
    error = ""
    with timing.busy_share(mode.device, every_s=1.0) as busy:
        try:
            seconds = _tibnlp(args, env, log)
        except SystemExit as exc:  # still return what the finished stages wrote
            error, seconds = str(exc), float("nan")
    facts: dict[str, dict[str, Any]] = {}
    models: dict[str, Path] = {}
    rows: list[str] = []
    for stage in ("pretrain", "adapt"):
        out = _stage_out(work, stage)
        if out is None or not (out / "model" / "model" / "model.safetensors").exists():
            continue
        models[stage] = out / "model" / "model"
        extra = read_extra(models[stage])
        facts[stage] = extra
        tokens, seconds_in = stage_run(extra)
        rows.append(
            f"| {stage} | {extra.get('step', '')} | {tokens:,.0f} | {seconds_in:.0f} | "
            f"{tokens / max(seconds_in, 1e-9):,.0f} | {extra.get('stopped_by', '')} | "
            f"{extra.get('hardware', '')} |"
        )
    metrics = _stage_metrics(uri, facts)
    parts = []  # the fine-tuned model (pretrain's weights are inside its history)
    if "adapt" in models:
        parts = _split_into(models["adapt"], mode.out, "wide-model")
    for stage in ("finetune", "twin"):
        out = _stage_out(work, stage)  # the run's own results.json (per-seed predictions)
        found = sorted(out.glob("finetune/tncc-title/*/results.json")) if out else []
        if found:
            target = mode.out / "wide-results" / stage
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy2(found[0], target / "results.json")
    # the pipeline's own result table (gain over the twin with its interval), read from its
    # log: running `finetune report` / `compare` after it would cost the lease ~15 s more
    text = log.read_text()
    start = text.find("Fine-tuning results")
    table = text[start : text.find("\n\n", text.find("\n|", start))] if start >= 0 else ""
    _dump(
        mode,
        "wide",
        {"facts": facts, "metrics": metrics, "busy": busy, "parts": parts, "seconds": seconds},
    )
    lines = [
        _command_line(WIDE_PIPELINE, [*sets[1:], *until], seconds, busy),
        "",
        "| stage | step | stage tokens | stage s | tokens/s | stopped by | hardware |",
        "|---|---:|---:|---:|---:|---|---|",
        *rows,
        "",
        *_metric_lines(metrics),
        "",
        table.strip(),
        "",
        f"Title stage's model returned as {', '.join(parts) or 'nothing'}; "
        + (
            f"no fine-tuning on the device (--until {mode.until})."
            if mode.until
            else "fine-tuning results as wide-results/{finetune,twin}/results.json in reports.tar."
        ),
    ]
    if error:
        raise SystemExit("\n".join([*lines, "", f"(after the stages above) {error}"]))
    return "\n".join(lines)


# ---- loop --------------------------------------------------------------------------------
def _toy_corpus(mode: Mode) -> Path:
    from tibnlp.data.datadir import data_dir

    path = mode.work / "cpu-corpus.txt"
    if not path.exists():
        with lzma.open(data_dir() / "corpora" / CPU_CORPUS, "rt", encoding="utf-8") as fh:
            path.write_text("".join(line for _, line in zip(range(CPU_LINES), fh, strict=False)))
    return path


def loop(mode: Mode, env: dict[str, str]) -> str:
    """benchmarks/gpu/loopprof.py over the curve's corpus stage (its config, the carried start,
    its two corpora prepared here)."""
    import yaml

    from tibnlp.config.core import deep_merge
    from tibnlp.data.datadir import require
    from tibnlp.pipeline.planner import DATA_PREFIX
    from tibnlp.pipeline.spec import load_pipeline

    start = _start(mode, "loop")
    log = mode.out / "loop.log"
    log.unlink(missing_ok=True)
    spec = load_pipeline(CURVE_PIPELINE, [f"vars.start={start}"])
    corpus = mode.work / "loop-corpus"
    if mode.cpu:
        inputs = [_toy_corpus(mode)]
    else:  # the curve's corpora, named data:FOLDER/FILE in the pipeline
        inputs = [require(c.removeprefix(DATA_PREFIX)) for c in spec.vars["corpora"]]
    if not (corpus / "corpus.yaml").exists():
        ins = [a for p in inputs for a in ("--input", str(p))]
        _tibnlp(
            ["corpus", "prepare", *ins, "--output", str(corpus), "--force", "--no-progress"],
            env,
            log,
        )
    stage = next(s for s in spec.stages if s.name == "pretrain")  # its batch and lr (vars)
    cfg: dict[str, Any] = json.loads(json.dumps(deep_merge(spec.config, stage.config)))
    cfg["pretrain"].update(
        {
            "corpus": str(corpus),
            "vocab": str(start),
            "init_from": str(start),
            "max_tokens": 0,
            "time_budget": "",
            "export_at_tokens": [],
            "eval_every": 10**6,
            "checkpoint_every": 10**6,
        }
    )
    cfg["tracking"] = {"uri": f"sqlite:///{mode.work / 'mlflow.db'}", "experiment": "gpu-loop"}
    if mode.cpu:
        cfg["engine"] = {"precision": "fp32", "zero_stage": 0, "threads": 2}
        cfg["pretrain"].update({"batch_size": 8, "seq_len": 32})
    else:
        cfg["engine"]["num_workers"] = 8
    steps, window = ("8", "3") if mode.cpu else ("80", "30")
    batch = int(cfg["pretrain"]["batch_size"])
    compiler = "aot_eager" if mode.cpu else "inductor"
    variants: dict[str, tuple[list[str], dict[str, Any]]] = {  # loopprof flags, config keys
        "as configured": ([], {}),
        "2 threads": (["--threads", "2"], {}),
        "no prefetch": (["--no-prefetch"], {}),
        # the host's fixed cost per step spread over 4x the rows (pipelines/gpu_curve.yaml's
        # vars.batch): what a GPU curve gains from a larger batch
        f"batch {4 * batch}": ([], {"pretrain": {"batch_size": 4 * batch}}),
        # fewer, fused kernels a step: the speed benchmark's compiled model ran 1.1-1.9x its
        # eager tokens/s; the CPU mode traces only (aot_eager: inductor takes minutes there)
        "compiled": ([], {"engine": {"compile": compiler}}),
        # what the curve ran before the eighth lease: one process has nothing to shard, and
        # ZeRO's per-gradient hooks are host time (87 ms a step against 57 without, gpu.md)
        "ZeRO 1": ([], {"engine": {"zero_stage": 1}}),
        # what ZeRO 0 clipped with before fused_clip: two kernels per parameter tensor a step
        "DeepSpeed's clipping": (["--deepspeed-clip"], {}),
        # what a lone process did before skip_lone_allreduce: flatten, reduce over a world
        # of one and copy back every gradient a step (73 copies in collate.md's CPU profile)
        "DeepSpeed's all-reduce": (["--deepspeed-allreduce"], {}),
    }
    rows = ["| variant | step ms | of which batch wait ms | tokens/s at full rows | GPU busy |"]
    rows.append("|---|---:|---:|---:|---:|")
    picked = pick_variants(variants, mode.variants)
    for i, (name, (extra, keys)) in picked:
        folder, output = mode.out / "loop" / f"v{i}", mode.work / f"loop-run-{i}"
        shutil.rmtree(output, ignore_errors=True)  # each variant a fresh run of its own
        variant = copy.deepcopy(cfg)
        variant["pretrain"]["output"] = str(output)
        for section, values in keys.items():
            variant[section].update(values)
        path = mode.work / f"loop-{i}.yaml"
        path.write_text(yaml.safe_dump(variant, sort_keys=False))
        cmd = [sys.executable, "-m", "benchmarks.gpu.loopprof", str(path), str(folder)]
        cmd += ["--steps", steps, "--window", window, *extra]
        with log.open("a") as fh:
            done = subprocess.run(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT)
        if done.returncode:
            raise SystemExit(f"loop: loopprof failed (see {log}):\n{log.read_text()[-3000:]}")
        r = json.loads((folder / "loop.json").read_text())
        rows.append(
            f"| {name} ({r['threads']} threads) | {r['step_ms_median']:.1f} | "
            f"{r['wait_ms_median']:.1f} | {r['tokens_per_s_at_full_rows']:,.0f} | "
            f"{100 * r['gpu_busy']:.0f}% |"
        )
        _pack(mode)  # each variant's profile comes back even if a later one is cut off
    first = picked[0][0]
    detail = (mode.out / "loop" / f"v{first}" / "loop.md").read_text()
    return "\n".join(rows) + f"\n\nVariant {first} in detail:\n\n" + detail


def pick_variants(variants: dict[str, Any], spec: str) -> list[tuple[int, tuple[str, Any]]]:
    """(index, (name, value)) of the variants `spec` names by index ("0,3"; empty: all), so a
    short lease can run the one that matters first and the rest when time is left."""
    items = list(enumerate(variants.items()))
    if not spec.strip():
        return items
    try:
        wanted = sorted({int(x) for x in spec.split(",")})
    except ValueError:  # "x", "," or "1,"
        wanted = []
    if not wanted or not all(0 <= i < len(items) for i in wanted):
        names = ", ".join(f"{i}: {name}" for i, (name, _) in items)
        raise SystemExit(f"loop: --variants {spec!r}: give indices among {names}")
    return [items[i] for i in wanted]


# ---- finetune ----------------------------------------------------------------------------
def find_model(mode: Mode) -> Path:
    """The pretrain part's model: on a still-warm machine in WORK, else the curve part's title
    stage there, else reassembled from the parts a session carried back into .bundle/
    (`cp FILES_AT/model.tar.part* .bundle/`)."""
    here = mode.work / "pretrain" / "model"
    if here.exists():
        return here
    adapted = sorted((mode.work / "curve" / "adapt").glob("out-*/model/model"))
    if adapted:
        return adapted[-1]
    parts = sorted(BUNDLE.glob("model.tar.part*"), key=lambda p: int(p.name.rsplit("part", 1)[1]))
    if not parts:
        raise SystemExit(
            f"finetune: no pretrained model: neither {here} (run `pretrain` first, same "
            f"machine) nor {BUNDLE}/model.tar.part* (copy the pretrain part's returned files)"
        )
    tar_path = mode.work / "model.tar"
    with tar_path.open("wb") as fh:
        for p in parts:
            fh.write(p.read_bytes())
    with tarfile.open(tar_path) as tar:
        tar.extractall(mode.work / "carried", filter="data")
    return mode.work / "carried" / "model"


MAIN_JOB = Path("pipelines/quickstart.yaml")
# the keys of the main job's fine-tuning that make its recipe (LP-FT, then everything); task,
# head, seeds and the states read are each run's own
RECIPE_KEYS = ("optimizer.lr", "epochs", "patience", "probe_epochs", "probe_lr")


def main_job_finetune() -> dict[str, Any]:
    """The README main job's `finetune` section, flat (`optimizer.lr`), read from its pipeline
    file so the device runs the recipe the CPU runs, whatever it becomes."""
    from tibnlp.config.core import flatten
    from tibnlp.pipeline.spec import load_pipeline

    return flatten(load_pipeline(MAIN_JOB).config.get("finetune", {}))


def _sets(items: dict[str, Any]) -> list[str]:
    """`--set finetune.KEY=VALUE` arguments (JSON values: YAML reads them back as they were)."""
    return [a for k, v in items.items() for a in ("--set", f"finetune.{k}={json.dumps(v)}")]


def finetune_runs(model: Path, cpu: bool) -> dict[str, list[str]]:
    """The fine-tuning commands, WCM-bo first (never measured on a device), then its random-init
    twin, titles last (measured on the CPU already).

    Every WCM-bo reading feeds the encoder rows of the model's max_len: `truncate` and
    `segments` read windows of max_len, `memory` a window of 3/4 of it behind `[CLS] memory
    [SEP]` with the rest as its budget (GEMFormer's comparison at equal input length)."""
    from tibnlp.models.io import load_config_file

    layers = main_job_finetune().get("layers", [-1])
    max_len = load_config_file(model).max_len
    window = max(8, 3 * max_len // 4)
    budget = max_len - window - 1
    wcm = ["finetune", "classify", "--dataset", "wcm_bo", "--set", "finetune.layers=[-1]"]
    whole = ["--set", f"finetune.max_len={max_len}"]
    twin = ["--set", "finetune.init=random"]
    runs = {
        "wcm-truncate": [*wcm, *whole, "--set", "finetune.long_document=truncate"],
        "wcm-segments": [*wcm, *whole, "--set", "finetune.long_document=segments"],
        "wcm-memory": [
            *wcm,
            *["--set", "finetune.long_document=memory", "--set", f"finetune.max_len={window}"],
            *["--set", f"finetune.global_memory.budget={budget}"],
        ],
        # the random-init twin (same shape, vocabulary, head and recipe): what pretraining buys
        # on documents (memory selects with the pretrained MLM, so it has no twin)
        "wcm-truncate-twin": [*wcm, *whole, "--set", "finetune.long_document=truncate", *twin],
        "wcm-segments-twin": [*wcm, *whole, "--set", "finetune.long_document=segments", *twin],
        # the main job's own title run: its CNN reads the states the main job's reads
        "tncc-title": ["finetune", "tncc", "--task", "title", *_sets({"layers": layers})],
    }
    if cpu:  # toy sizes: one run of each kind
        for name in ("wcm-truncate", "wcm-truncate-twin"):
            del runs[name]
    return runs


def pick_runs(runs: dict[str, list[str]], spec: str) -> dict[str, list[str]]:
    """The runs `--runs A,B` names, in the part's order (a lease finishing what the last cut)."""
    if not spec:
        return runs
    wanted = [x.strip() for x in spec.split(",") if x.strip()]
    unknown = [x for x in wanted if x not in runs]
    if unknown or not wanted:
        raise SystemExit(f"finetune: --runs {spec!r}: give names among {', '.join(runs)}")
    return {k: v for k, v in runs.items() if k in wanted}


def finetune(mode: Mode, env: dict[str, str]) -> str:
    """Each run in turn; after each, the `finetune report` of those done so far is the
    section (a cut lease keeps them), and a failed run is recorded and the next still runs."""
    model = find_model(mode)
    log = mode.out / "finetune.log"
    log.unlink(missing_ok=True)
    uri = f"sqlite:///{mode.work / 'mlflow.db'}"
    seeds = "1" if mode.cpu else "1,2,3"
    common = ["--model", str(model), "--head", "cnn", "--seeds", seeds]
    common += ["--set", f"tracking.uri={uri}", "--set", "tracking.experiment=gpu-finetune"]
    recipe = main_job_finetune()
    common += _sets({k: recipe[k] for k in RECIPE_KEYS if k in recipe})
    if mode.cpu:
        common += ["--set", "finetune.epochs=1", "--set", "finetune.limit_train=64"]
        common += ["--set", "finetune.cnn_channels=8", "--set", "finetune.document_max_len=128"]
        common += ["--set", "finetune.probe_epochs=1"]
    sets = [a for x in mode.sets for a in ("--set", x)]  # last, so they win
    seconds: dict[str, float] = {}
    failed: dict[str, str] = {}
    text = ""
    name = ""
    try:  # the time limit (SIGTERM) may come in a run or in the report after it
        for name, args in pick_runs(finetune_runs(model, mode.cpu), mode.runs).items():
            target = mode.work / "finetune" / name
            shutil.rmtree(target, ignore_errors=True)
            argv = [*args, *common, "--set", f"finetune.output={target}", *sets]
            try:
                seconds[name] = _tibnlp(argv, env, log)
                for found in target.rglob("results.json"):  # per-seed predictions, `compare`
                    keep = mode.out / "finetune" / name / found.relative_to(target)
                    keep.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(found, keep)
            except SystemExit as exc:
                failed[name] = str(exc)[-1500:]
            outputs = [str(mode.work / "finetune" / done) for done in seconds]
            text = _finetune_text(seeds, seconds, failed, outputs, env)
            _dump(mode, "finetune", {"seconds": seconds, "failed": failed, "model": str(model)})
            partial = f"(partial: the part was still running)\n\n{text}"
            results.write_part(mode.out, "finetune", partial)
            _pack(mode)
    except Terminated as exc:  # the section keeps the runs that finished
        raise SystemExit(
            f"{exc} during {name} or its report\n\nThe runs before:\n\n{text}"
        ) from exc
    if not seconds:
        raise SystemExit(f"finetune: every run failed:\n{text}")
    return text


def _finetune_text(
    seeds: str,
    seconds: dict[str, float],
    failed: dict[str, str],
    outputs: list[str],
    env: dict[str, str],
) -> str:
    report = ""
    if outputs:
        report = subprocess.run(
            [sys.executable, "-m", "tibnlp.cli.main", "finetune", "report", *outputs],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,  # the table (stdout) and any warning (stderr), in order
            text=True,
            check=False,
        ).stdout.strip()
    timing_line = ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items())
    lines = [f"Seeds {seeds}; wall time per command: {timing_line or 'none finished'}."]
    lines += [f"\n**{name} FAILED**:\n\n```\n{err}\n```" for name, err in failed.items()]
    return "\n".join(lines) + (f"\n\n{report}" if report else "")


# ---- driver ------------------------------------------------------------------------------
def _dump(mode: Mode, name: str, payload: dict[str, Any]) -> None:
    (mode.out / f"{name}.json").write_text(json.dumps(payload, indent=1, default=str) + "\n")


def speed(mode: Mode, env: dict[str, str]) -> str:
    from benchmarks.gpu.speed import SpeedSettings, run_speed

    done: list[str] = []  # the text of the blocks that finished

    def emit(text: str, payload: dict[str, Any]) -> None:  # the eager figures survive a kill
        done.append(text)
        _dump(mode, "speed", payload)
        results.write_part(mode.out, "speed", f"(partial: the part was still running)\n\n{text}")
        _pack(mode)

    settings = SpeedSettings.tiny() if mode.cpu else SpeedSettings("cuda", compile=mode.compile)
    if mode.blocks:
        settings = replace(settings, blocks=mode.blocks)  # validated there
    try:
        text, payload = run_speed(settings, emit)
    except Exception as exc:  # run() writes the error as the section: keep the finished blocks
        if not done:
            raise
        raise SystemExit(
            f"{type(exc).__name__}: {exc}\n\nThe blocks before it:\n\n{done[-1]}"
        ) from exc
    _dump(mode, "speed", payload)
    return text


PARTS = {
    "check": check,
    "speed": speed,
    "pretrain": pretrain,
    "curve": curve,
    "wide": wide,
    "loop": loop,
    "finetune": finetune,
}


def _pack(mode: Mode) -> None:
    """With --pack DIR: the small files into DIR/reports.tar (rewritten whole, then renamed)
    and the model parts moved there, so DIR holds few files."""
    if mode.pack is None:
        return
    mode.pack.mkdir(parents=True, exist_ok=True)
    for part in mode.out.glob("*.tar.part*"):
        shutil.move(str(part), mode.pack / part.name)
    tmp = mode.pack / "reports.tar.tmp"
    with tarfile.open(tmp, "w") as tar:
        for path in sorted(mode.out.rglob("*")):
            if path.is_file():
                tar.add(path, arcname=str(path.relative_to(mode.out)))
    tmp.replace(mode.pack / "reports.tar")


class Terminated(Exception):
    """SIGTERM, as lease.sh's `timeout` sends at a part's time limit."""


SIGNALLED: list[int] = []  # set by the handler, whatever wraps the exception it raises


def _terminated(signum: int, frame: Any) -> None:
    SIGNALLED.append(signum)
    raise Terminated(
        f"killed by {signal.Signals(signum).name} (its time limit); files so far packed"
    )


def run(parts: list[str], mode: Mode) -> int:
    """Each part in turn; a failed one writes its error as its section and the rest still run;
    one killed by SIGTERM (a `timeout`) packs what it wrote and ends the run.
    Returns the number of parts that failed."""
    import torch

    if not mode.cpu and not torch.cuda.is_available():
        raise SystemExit("run: no CUDA device here; use --cpu for the CPU mode")
    mode.out.mkdir(parents=True, exist_ok=True)
    mode.work.mkdir(parents=True, exist_ok=True)
    env = install() if not mode.cpu else {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path.cwd()), env.get("PYTHONPATH")]))
    failed = 0
    SIGNALLED.clear()
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        for part in parts:
            t0 = time.perf_counter()
            try:
                text = PARTS[part](mode, env)
            except (Exception, SystemExit) as exc:
                failed += 1
                text = f"**FAILED**: {type(exc).__name__}: {exc}"
                print(text, file=sys.stderr, flush=True)
            where = "CPU mode (toy sizes; not a measurement)" if mode.cpu else "device"
            header = (
                f"`python -m benchmarks.gpu run {part}{' --cpu' if mode.cpu else ''}`: {where}, "
                f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
                f"{time.perf_counter() - t0:.0f} s."
            )
            results.write_part(mode.out, part, f"{header}\n\n{text}")
            _pack(mode)
            print(f"{header}\n\n{text}\n", flush=True)
            if SIGNALLED:  # the time limit: what the part wrote is packed, no next part
                break
    finally:
        signal.signal(signal.SIGTERM, previous)
    return failed
