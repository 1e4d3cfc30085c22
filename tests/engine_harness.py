"""A tiny stand-in model and data for the engine tests, runnable as a (multi-process) script.

    python tests/engine_harness.py OUT_DIR '{"max_steps": 6, ...}'

Trains with the real engine (DeepSpeed, checkpoints, MLflow through Tracker) and writes
OUT_DIR/result.json (final step, metrics) and OUT_DIR/weights.pt (rank 0's parameters).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

VOCAB, SEQ, N_EXAMPLES = 50, 12, 96


class TinyPretrainer(nn.Module):
    """Embeddings, dropout (so RNG state matters), a width-3 convolution (so a masked token
    can be read off its neighbours), a linear MLM head and a pooled SOP head."""

    def __init__(self, nan_at: int = 0, dropout: float = 0.1) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.drop = nn.Dropout(dropout)
        self.conv = nn.Conv1d(16, 16, 3, padding=1)
        self.mlm = nn.Linear(16, VOCAB)
        self.sop = nn.Linear(16, 2)
        self.nan_at = nan_at
        self.calls = 0

    def forward(self, input_ids, attention_mask, mlm_labels, sop_labels):  # type: ignore[no-untyped-def]
        if self.training:
            self.calls += 1
        h = self.conv(self.drop(self.embed(input_ids)).transpose(1, 2)).transpose(1, 2)
        logits = self.mlm(h)
        mask_loss = nn.functional.cross_entropy(
            logits.view(-1, VOCAB), mlm_labels.view(-1), ignore_index=-100
        )
        pooled = (h * attention_mask.unsqueeze(-1)).sum(1) / attention_mask.sum(1, keepdim=True)
        sop_logits = self.sop(pooled)
        sop_loss = nn.functional.cross_entropy(sop_logits, sop_labels)
        sel = mlm_labels != -100
        loss = mask_loss + sop_loss
        if self.nan_at and self.calls >= self.nan_at:
            loss = loss * float("nan")
        return {
            "loss": loss,
            "mask_loss": mask_loss,
            "mask_accuracy": (logits.argmax(-1)[sel] == mlm_labels[sel]).float().mean(),
            "sop_loss": sop_loss,
            "sop_accuracy": (sop_logits.argmax(-1) == sop_labels).float().mean(),
        }


def examples(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # Each row repeats one token: learnable from context (MLM) and from any token (SOP).
    ids = torch.randint(5, VOCAB, (N_EXAMPLES, 1), generator=g).repeat(1, SEQ)
    lengths = torch.randint(SEQ // 2, SEQ + 1, (N_EXAMPLES,), generator=g)
    return ids, lengths


FIXED_MASKS = (1, 3, 5)  # inside every row (lengths >= SEQ // 2): as many targets in each row


def make_collate(ids: torch.Tensor, lengths: torch.Tensor, seed: int, fixed: bool = False):  # type: ignore[no-untyped-def]
    """Random 30 % masks, or (`fixed`) the positions FIXED_MASKS in every row, so that every
    micro-batch holds as many MLM targets and the mean of their mean losses is the batch's."""

    def collate(indices: list[int], key: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(seed * 1_000_003 + key)
        batch = ids[list(indices)].clone()
        mask = (torch.arange(SEQ)[None, :] < lengths[list(indices)][:, None]).long()
        batch[mask == 0] = 0
        chosen = (torch.rand(batch.shape, generator=g) < 0.3) & (mask == 1)
        if fixed:
            chosen = torch.zeros_like(chosen)
            chosen[:, list(FIXED_MASKS)] = True
        labels = torch.where(chosen, batch, torch.full_like(batch, -100))
        batch[chosen] = 4
        sop = (ids[list(indices), 0] % 2).long()
        return {"input_ids": batch, "attention_mask": mask, "mlm_labels": labels, "sop_labels": sop}

    return collate


def make_plan(batch_size: int, seed: int):  # type: ignore[no-untyped-def]
    def plan(epoch: int) -> list[list[int]]:
        order = torch.randperm(N_EXAMPLES, generator=torch.Generator().manual_seed(seed + epoch))
        return [order[i : i + batch_size].tolist() for i in range(0, N_EXAMPLES, batch_size)]

    return plan


def quiet_settings(checkpoint_dir: Path, **settings: Any) -> Any:
    """LoopSettings of a one-step test loop: no log, evaluation or checkpoint but those
    `settings` ask for."""
    from tibnlp.training.loop import LoopSettings

    quiet: dict[str, Any] = dict(
        max_steps=1,
        log_every=1000,
        eval_every=1000,
        eval_batches=0,
        checkpoint_every=0,
        keep_checkpoints=1,
        checkpoint_dir=checkpoint_dir,
        progress=False,
    )
    return LoopSettings(**{**quiet, **settings})


def tiny_loop(training: Any, checkpoint_dir: Path, **settings: Any) -> Any:
    """The tiny pretrainer's loop over `examples(0)` (batch 8, no held-out data)."""
    ids, lengths = examples(0)
    train = training.batches(make_plan(8, 0), make_collate(ids, lengths, 0), 8)
    return training.loop(train, None, quiet_settings(checkpoint_dir, **settings))


def main(out: Path, overrides: dict[str, Any]) -> None:
    from tibnlp.config import EngineConfig, OptimizerConfig
    from tibnlp.tracking import Tracker
    from tibnlp.training.engine import init_distributed, shutdown
    from tibnlp.training.fit import fit
    from tibnlp.training.loop import LoopSettings
    from tibnlp.training.wiring import start_training

    o = {
        "max_steps": 6,
        "batch_size": 8,
        "micro_batch_size": 0,
        "checkpoint_every": 2,
        "eval_every": 3,
        "lr": 5e-3,
        "optimizer": "adamw",
        "nan_at": 0,
        "zero_stage": 0,
        "resume": False,
        "sleep_after_step": 0.0,
        "seed": 7,
        "dropout": 0.1,
        "time_budget_s": None,
        "precision": "auto",
        "deterministic": False,  # CUDA: deterministic kernels (bit-identical resume)
        "prefetch": None,  # LoopSettings.prefetch (None: on a GPU only)
        "fixed_masks": False,  # the same MLM positions in every row (make_collate)
        "grad_clip": 1.0,
        "rank_weights": False,  # every rank writes its parameters: weights-rank{N}.pt
        **overrides,
    }
    if o["deterministic"]:
        import os

        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts
        torch.use_deterministic_algorithms(True)
    engine_cfg = EngineConfig(zero_stage=o["zero_stage"], threads=1, precision=o["precision"])
    world = init_distributed(engine_cfg)
    torch.manual_seed(o["seed"])
    model = TinyPretrainer(nan_at=o["nan_at"], dropout=o["dropout"])
    optim = OptimizerConfig(
        name=o["optimizer"], lr=o["lr"], warmup_steps=2, grad_clip=o["grad_clip"]
    )
    training = start_training(
        model, engine_cfg, optim, o["batch_size"], o["micro_batch_size"], o["max_steps"], world
    )
    engine = training.engine
    ids, lengths = examples(o["seed"])
    collate = make_collate(ids, lengths, o["seed"], o["fixed_masks"])
    train = training.batches(make_plan(o["batch_size"], o["seed"]), collate, o["batch_size"])
    heldout = training.batches(make_plan(o["batch_size"], 999), collate, o["batch_size"])
    settings = LoopSettings(
        max_steps=o["max_steps"],
        log_every=1,
        eval_every=o["eval_every"],
        eval_batches=2,
        checkpoint_every=o["checkpoint_every"],
        keep_checkpoints=2,
        checkpoint_dir=out / "checkpoints",
        progress=False,
        time_budget_s=o["time_budget_s"],
        prefetch=o["prefetch"],
    )
    loop = training.loop(train, heldout, settings)

    def open_tracker(run_id: str | None) -> Tracker:
        return Tracker(
            "engine-tests", uri=f"sqlite:///{out.parent / 'mlflow.db'}", resume_run_id=run_id
        )

    def on_log(step: int, metrics: dict[str, float]) -> None:
        if o["sleep_after_step"]:
            import time

            print(f"step {step}", flush=True)
            time.sleep(o["sleep_after_step"])

    result = fit(loop, o["resume"], open_tracker, on_log)
    if o["rank_weights"]:
        torch.save(engine.module.state_dict(), out / f"weights-rank{world.rank}.pt")
    if world.is_main:
        result.tracker.end()
        params = {k: v.detach().clone() for k, v in engine.module.state_dict().items()}
        torch.save(params, out / "weights.pt")
        (out / "result.json").write_text(
            json.dumps(
                {
                    "step": result.step,
                    "train": result.train,
                    "eval": result.eval,
                    "run_id": result.tracker.run_id,
                    "stopped_by": result.stopped_by,
                    "world": world.size,
                }
            )
        )
    shutdown(world)


def torchrun(out: Path, overrides: dict[str, Any], nproc: int = 2) -> Any:
    """`main(out, overrides)` in `nproc` CPU processes under torchrun (gloo); the finished
    process, its output captured."""
    import os
    import subprocess

    from tibnlp.tracking.server import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, *sys.path])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc)]
    cmd += ["--master_port", str(port), str(Path(__file__)), str(out), json.dumps(overrides)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def _child(out: Path, overrides: dict[str, Any]) -> Any:
    import os
    import subprocess

    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, *sys.path])}
    return subprocess.Popen(
        [sys.executable, str(Path(__file__)), str(out), json.dumps(overrides)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run_child(out: Path, overrides: dict[str, Any], timeout: float = 600) -> None:
    """This script in a fresh process (its own CUDA context and deterministic settings)."""
    proc = _child(out, overrides)
    output, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, output


def run_until_killed(out: Path, overrides: dict[str, Any], tag: str, timeout: float = 600) -> None:
    """Run this script in a child process and SIGKILL it once checkpoint `tag` is complete
    (the run must sleep between steps, `sleep_after_step`, so the kill lands mid-run)."""
    import os
    import signal
    import time

    from tibnlp.training import checkpoint

    proc = _child(out, overrides)
    deadline = time.monotonic() + timeout
    try:
        while checkpoint.latest_tag(out / "checkpoints") != tag:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, f"no checkpoint {tag} in time"
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)  # mid-run: later steps are still to come
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "result.json").exists()


if __name__ == "__main__":
    main(Path(sys.argv[1]), json.loads(sys.argv[2]) if len(sys.argv) > 2 else {})
    from tibnlp.training import worker_exit

    worker_exit.end(0)  # as the CLI ends a launched worker
