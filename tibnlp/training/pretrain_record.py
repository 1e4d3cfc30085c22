"""What a pretraining run records about itself: the facts every model directory it writes
carries (`read_extra`: step, tokens, seconds, analytic FLOPs, hardware, what it continued
from), those directories (OUTPUT/model, OUTPUT/exports/tokens-N), and its MLflow run (resolved
params, data and provenance tags, config and vocabulary artifacts, --eval-only's scores).

Cut from pretrain.py, which runs the training: this is what budgets, learning curves and
fine-tuning's `pretrain.*` params read back, and a new fact (a skip-gram warm start's cost,
say) reaches the model metadata and the run's params together, here.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from tibnlp.config import Config, ModelConfig, dump_yaml, to_dict
from tibnlp.config.train import PretrainConfig
from tibnlp.fsutil import atomic_write_text
from tibnlp.models.io import save_pretrained
from tibnlp.models.summary import electra_flops_per_token, training_flops_per_token
from tibnlp.standard_json import dumps
from tibnlp.text.vocab import Vocabulary, copy_vocabulary
from tibnlp.tracking import Tracker, provenance_tags, tracker_from_config
from tibnlp.training.engine import hardware_name
from tibnlp.training.loop import LoopResult, Progress
from tibnlp.training.wiring import Training


def flops_per_token(model_cfg: ModelConfig, p: PretrainConfig) -> float:
    """The analytic training FLOPs of one token (ELECTRA: generator and discriminator)."""
    if p.objective == "electra":
        return electra_flops_per_token(model_cfg, p.seq_len, p.mask_prob, p.generator_ratio)
    return training_flops_per_token(model_cfg, p.seq_len, p.mask_prob)


@dataclasses.dataclass(frozen=True)
class ModelFacts:
    """The metadata of a run's model directories. A continued run counts the compute of the
    model it starts from (`before`): a curve or a budget compares what the whole encoder
    cost (its own share stays in `continued_tokens`)."""

    before: dict[str, Any]  # tokens, seconds, FLOPs of init_from's model or skip-gram start
    init_from: str
    flops_per_token: float
    run: dict[str, Any]  # the same at every step: objective, vocabulary, processes, hardware

    def inherited(self) -> dict[str, Any]:
        """A skip-gram warm start's cost, also when inherited from the init_from model."""
        return {k: v for k, v in self.before.items() if k.startswith("skipgram_")}

    def at(self, progress: Progress) -> dict[str, Any]:
        continued = {"init_from": self.init_from} if self.init_from else {}
        own = {**continued, "continued_tokens": progress.tokens} if continued else {}
        before = self.before
        seconds = float(before.get("train_seconds", 0.0)) + progress.train_seconds
        return {
            "step": progress.step,
            "tokens": float(before.get("tokens", 0.0)) + progress.tokens,
            "train_seconds": round(seconds, 3),
            "flops": float(before.get("flops", 0.0)) + progress.tokens * self.flops_per_token,
            **self.inherited(),
            **own,
            **self.run,
        }


def model_facts(
    p: PretrainConfig, model_cfg: ModelConfig, vocab: Vocabulary, processes: int, before: dict
) -> ModelFacts:
    """Taken once the engine is up (it sets the thread count recorded)."""
    flops = flops_per_token(model_cfg, p)
    run = {
        "objective": p.objective,
        "vocab_sha256": vocab.sha256,
        "processes": processes,
        "threads": torch.get_num_threads(),
        "hardware": hardware_name(),
        "flops_per_token": flops,
    }
    return ModelFacts(before, p.init_from, flops, run)


def write_model_dir(
    module: torch.nn.Module, cfg: ModelConfig, vocab_dir: Path, out: Path, extra: dict
) -> Path:
    """Write a model directory atomically: build beside it, then swap in."""
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_pretrained(module, cfg, tmp, extra=extra)
    copy_vocabulary(vocab_dir, tmp)  # the vocabulary travels with the weights
    old = out.with_name(f".{out.name}.old")
    if out.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
    return out


def export_name(tokens: float) -> str:
    """The folder of the export at a token count: `tokens-1000000`."""
    return f"tokens-{int(tokens)}"


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """What a run's model directories and MLflow run say about it, fixed once its engine is
    up. Its methods run on the main process only."""

    cfg: Config  # (its model section is init_from's, for a run that continues a model)
    model_cfg: ModelConfig  # resolved: the vocabulary's size, the heads' threshold
    facts: ModelFacts
    training: Training  # its engine's module: the weights the model directories hold
    meta: dict[str, Any]  # the tokenised data's facts, tagged
    config_path: Path  # the run's config file, an artifact

    @property
    def output(self) -> Path:
        return Path(self.cfg.pretrain.output)

    def _write(self, out: Path, extra: dict[str, Any]) -> None:
        write_model_dir(
            self.training.engine.module, self.model_cfg, Path(self.cfg.pretrain.vocab), out, extra
        )

    def export(self, target: float, at: Progress) -> None:
        """OUTPUT/exports/tokens-N, when the run reaches N training tokens (`loop.Exporter`)."""
        name = export_name(target)
        self._write(self.output / "exports" / name, self.facts.at(at))
        print(f"exported {self.output / 'exports' / name} (step {at.step})", file=sys.stderr)

    def final_model(self, at: Progress, result: LoopResult) -> Path:
        """OUTPUT/model, logged as the run's artifact with its final tags; the run ends."""
        model_dir = self.output / "model"
        extra = {
            **self.facts.at(at),
            "stopped_by": result.stopped_by,
            "schedule": result.schedule,
            "mlflow_run_id": result.tracker.run_id or "",
        }
        self._write(model_dir, extra)
        result.tracker.log_artifact(model_dir, "model")
        tags = {"stopped_by": result.stopped_by, "final_step": str(result.step)}
        result.tracker.set_tags({**tags, **result.schedule})
        result.tracker.end()
        return model_dir

    def open_tracker(self, resume: bool, run_id: str | None) -> Tracker:
        """The run to log into: the checkpoint's (resume), the pipeline stage's
        (`tracking.run_id`), or a new one (standalone). Called on rank 0 once any
        checkpoint has loaded: a resumed run's config.yaml (its new max_steps, say) is
        written here, so a resume that fails leaves the file describing the checkpoints."""
        if resume:
            dump_yaml(self.cfg, self.output / "config.yaml")
        t = self.cfg.tracking
        in_stage = bool(t.run_id) and run_id is None
        tracking = dataclasses.replace(t, run_id=run_id or t.run_id)
        tracker = tracker_from_config(tracking, self.output.name, {"stage": "pretrain"})
        if run_id is not None:  # resumed: the run was described when it started
            return tracker
        self._describe(tracker, in_stage)
        return tracker

    def _describe(self, tracker: Tracker, in_stage: bool) -> None:
        """A new run's params (the config and what it resolved to), tags (vocabulary,
        provenance, the tokenised data's `meta`) and artifacts (config file, vocabulary)."""
        cfg, p, model_cfg, facts = self.cfg, self.cfg.pretrain, self.model_cfg, self.facts
        vocab_dir = Path(p.vocab)
        if not in_stage:  # a pipeline stage's run already holds the flattened config
            tracker.log_params(to_dict(cfg))
        tracker.log_params(
            {
                "resolved.model.vocab_size": model_cfg.vocab_size,
                "resolved.model.heads.threshold": model_cfg.heads.threshold,
                "resolved.processes": facts.run["processes"],
                "resolved.accumulation_steps": self.training.accumulation,
                "resolved.pretrain.corpus": p.corpus,
                "resolved.pretrain.vocab": p.vocab,
                "resolved.flops_per_token": round(facts.flops_per_token),
                "resolved.hardware": facts.run["hardware"],
                **{f"resolved.{k}": v for k, v in facts.inherited().items()},
            }
        )
        meta = self.meta
        tracker.set_tags(
            {
                "stage": "pretrain",
                "vocab.sha256": facts.run["vocab_sha256"],
                **provenance_tags(data=p.corpus, vocab=vocab_dir),
                **{f"data.{k}": str(v) for k, v in meta.items() if not isinstance(v, dict)},
                **{
                    f"data.{k}.{s}": str(n)
                    for k, v in meta.items()
                    if isinstance(v, dict)
                    for s, n in v.items()
                },
            }
        )
        tracker.log_artifact(self.config_path)
        tracker.log_artifact(vocab_dir, "vocabulary")

    def scores(self, tracker: Tracker, scores: dict[str, float], rows: int) -> Path:
        """--eval-only's scores: in its MLflow run (ended here), OUTPUT/eval.json, stdout."""
        p = self.cfg.pretrain
        tracker.log_metrics(scores, 0)
        tracker.set_tags({"eval_only": "true", "init_from": p.init_from})
        tracker.end()
        report = {"model": p.init_from, "corpus": p.corpus, "rows": rows, **scores}
        text = dumps(report, indent=2)  # a diverged loss (NaN) as null: standard JSON
        atomic_write_text(self.output / "eval.json", text + "\n")
        print(text)
        return self.output / "eval.json"
