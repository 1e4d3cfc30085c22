"""The one training loop: step, evaluate, log, checkpoint, stop; resumable at any checkpoint.

Generic over the model: `engine(**micro_batch)` must return a dict whose 0-d tensors are
metrics and whose "loss" is what is optimised. Pretraining and fine-tuning differ in the
model, the batch sources and the logged extras, not in this file. Fine-tuning adds three
settings, all off for pretraining: an `evaluator` callback (e.g. validation macro-F1 over the
whole split) in place of the held-out batches, keep-best selection on one of its metrics
(`select`, restored into the module when the run ends) and early stopping (`patience`).

Under `time_budget_s` the budget counts training wall time across resumes; `max_tokens` is a
compute budget in training tokens. The share spent of either (whichever is further along)
drives the lr schedule (`WarmupDecay.set_time_fraction`), so a budgeted run ends
annealed; `budget.BudgetWatch` records which of the two set it. `export_at_tokens`: when the
non-padding tokens trained on (all ranks) first reach each count, the `exporter` callback
writes the weights as they are after that step (a resumed run replays the same steps and
rewrites the same export).

One optimizer step and the held-out evaluation, as each rank runs them on the engine (with
the all-reduce that keeps the ranks in step), are `step.EngineStep`'s; a run's `--resume`
checks and the MLflow run opened around the loop are `fit.fit`'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tibnlp.training import checkpoint
from tibnlp.training.batches import ShardedBatches
from tibnlp.training.budget import BudgetWatch
from tibnlp.training.engine import World, all_reduce_sum
from tibnlp.training.keep_best import KeepBest
from tibnlp.training.prefetch import Prefetched
from tibnlp.training.progress import TrainProgress
from tibnlp.training.step import EngineStep, TrainingDiverged


@dataclass
class LoopSettings:
    max_steps: int
    log_every: int
    eval_every: int
    eval_batches: int
    checkpoint_every: int  # 0: never (a fine-tuning seed reruns whole)
    keep_checkpoints: int
    checkpoint_dir: Path
    time_budget_s: float | None = None
    progress: bool = True
    progress_label: str = "pretrain"
    # keep-best: the evaluation metric (without "eval/") whose highest value picks the weights
    # restored at the end; "" keeps the last weights
    select: str = ""
    patience: int = 0  # evaluations without a better `select` value before stopping; 0: never
    export_at_tokens: list[float] = field(default_factory=list)
    # stop once this many non-padding tokens (all ranks) are trained on; 0: no token budget.
    # A compute budget that holds on a shared or a different machine, unlike wall time.
    max_tokens: float = 0.0
    # collate the next batch in a background thread (pinned memory on a GPU); None: on a GPU
    prefetch: bool | None = None
    clock: Callable[[], float] = time.monotonic  # tests drive a simulated clock


@dataclass
class Progress:
    """Where training stands, as the exporter and the evaluation hooks see it."""

    step: int
    tokens: float  # non-padding tokens trained on, all ranks
    train_seconds: float  # wall time of training, summed over resumed runs


@dataclass
class LoopResult:
    step: int
    stopped_by: str  # "max_steps", "time_budget", "token_budget" or "early_stopping"
    train: dict[str, float] = field(default_factory=dict)
    eval: dict[str, float] = field(default_factory=dict)
    tracker: Any = None
    best_step: int = 0  # with `select`: the step whose weights were restored
    best: dict[str, float] = field(default_factory=dict)  # ... and its evaluation
    # resumed with its time or token budget already spent: no step was taken (says which)
    spent_before: str = ""
    # what set the lr schedule (`BudgetWatch.tags`): schedule_clock and, with both budgets,
    # how far the clock led the tokens
    schedule: dict[str, str] = field(default_factory=dict)


# Metrics of the whole held-out set, computed the same on every rank (it sees all of it).
Evaluator = Callable[[], dict[str, float]]
# Writes the weights as a model directory for the token count reached (rank 0 only).
Exporter = Callable[[float, Progress], None]


class TrainLoop:
    def __init__(
        self,
        engine: Any,
        world: World,
        train_data: ShardedBatches,
        eval_data: ShardedBatches | None,
        settings: LoopSettings,
        evaluator: Evaluator | None = None,
        exporter: Exporter | None = None,
    ) -> None:
        self.engine, self.world, self.settings = engine, world, settings
        self.train_data, self.eval_data = train_data, eval_data
        cuda = torch.device(getattr(engine, "device", "cpu")).type == "cuda"
        if settings.prefetch or (settings.prefetch is None and cuda):
            self.train_data = Prefetched(train_data, pin=cuda)  # type: ignore[assignment]
        self.evaluator = evaluator
        self.exporter = exporter
        self.tokens = 0.0
        self.train_seconds = 0.0
        self._targets = sorted(float(t) for t in settings.export_at_tokens)
        self.best: KeepBest | None = None  # with `select`: made when the run starts
        self.step = 0
        self.steps = EngineStep(engine, world)
        self.window: dict[str, float] = {}  # sums since the last log, restored on resume
        self.run_id: str | None = None
        # name -> an object beside the loop whose `state_dict()` rides in every checkpoint and
        # whose `load_state_dict` gets it back on resume (pretraining's LearningCheck: warned
        # or probed already, so a resumed run does neither again)
        self.budget = BudgetWatch(settings.time_budget_s, settings.max_tokens)
        self.extra_state: dict[str, Any] = {"budget": self.budget}

    # ---- one step ----------------------------------------------------------------------
    def to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return self.steps.to_device(batch)

    def train_step(self, over_budget: bool) -> tuple[dict[str, float], float, bool]:
        """One optimizer step; returns (metrics, tokens across ranks, stop flag)."""
        return self.steps.train(self.train_data.next(), over_budget, self.step + 1)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """The evaluator's metrics, or the mean metrics over the first `eval_batches`
        held-out batches (fixed masks)."""
        if self.evaluator is not None:
            self.engine.eval()
            metrics = self.evaluator()
            self.engine.train()
            return metrics
        if self.eval_data is None or self.settings.eval_batches == 0:
            return {}
        return self.steps.held_out(self.eval_data, self.settings.eval_batches)

    # ---- checkpoints ----------------------------------------------------------------
    def save(self) -> None:
        if not self.steps.weights_finite():
            raise TrainingDiverged(
                f"weights are not finite after step {self.step}; not saving a checkpoint, "
                "the last good one is untouched",
                "lower pretrain.optimizer.lr or raise warmup_steps, then --resume",
            )
        state = {
            "step": self.step,
            "data": self.train_data.state_dict(),
            "rng": checkpoint.rank_rng_states(),
            "mlflow_run_id": self.run_id or "",
            "window": dict(self.window),
            "tokens": self.tokens,
            "train_seconds": self.train_seconds,
            "extra": {name: obj.state_dict() for name, obj in self.extra_state.items()},
        }
        checkpoint.save(
            self.engine,
            self.settings.checkpoint_dir,
            self.step,
            state,
            self.settings.keep_checkpoints,
            self.world.is_main,
        )

    def restore(self) -> bool:
        """Load the newest complete checkpoint (collective). False when there is none."""
        loaded = checkpoint.load(self.engine, self.settings.checkpoint_dir, self.world.is_main)
        if loaded is None:
            return False
        _, state = loaded
        self.step = int(state["step"])
        self.train_data.load_state_dict(state["data"])
        self.window = {k: float(v) for k, v in state.get("window", {}).items()}
        # the rate's clock restarts here: only tokens trained from now on count towards it
        self.window.pop("_tokens", None)
        self.run_id = state.get("mlflow_run_id") or None
        self.tokens = float(state.get("tokens", 0.0))
        self.train_seconds = float(state.get("train_seconds", 0.0))
        saved = state.get("extra", {})  # (absent from checkpoints before it: fresh state)
        for name, obj in self.extra_state.items():
            if name in saved:
                obj.load_state_dict(saved[name])
        checkpoint.set_rank_rng_state(state["rng"], self.world.rank)
        # the optimizer state just loaded carries the lr the saved run's schedule set; this
        # run's schedule (e.g. a longer max_steps) decides the next update's lr
        self._apply_budget_share(reapply=True)
        return True

    # ---- budget and exports ---------------------------------------------------------
    @property
    def progress(self) -> Progress:
        return Progress(self.step, self.tokens, self.train_seconds)

    def budget_fraction(self) -> float:
        """Share of the time or token budget spent, whichever is further along (0: none)."""
        return self.budget.fraction(self.train_seconds, self.tokens)

    def _agreed(self, seconds: float) -> float:
        """Rank 0's training time, on every rank of a time-budgeted run. Each rank's clock
        starts when it enters the loop (rank 0 opens the MLflow run first), and the share of
        the budget spent sets the lr: ranks with their own clocks would update their replicas
        with different rates, and stop by a time rank 0 does not record."""
        if self.world.size == 1 or not self.settings.time_budget_s:
            return seconds
        mine = seconds if self.world.is_main else 0.0
        return float(all_reduce_sum(torch.tensor([mine], dtype=torch.float64))[0])

    def _apply_budget_share(self, reapply: bool = False) -> None:
        """Tell the schedule the share of the budget spent; `reapply`: also without a budget,
        to set the coming update's lr again (after a restore)."""
        scheduler: Any = getattr(self.engine, "lr_scheduler", None)
        budgeted = self.settings.time_budget_s or self.settings.max_tokens
        if (budgeted or reapply) and hasattr(scheduler, "set_time_fraction"):
            scheduler.set_time_fraction(self.budget_fraction())

    def _export_reached(self) -> None:
        while self._targets and self.tokens >= self._targets[0]:
            target = self._targets.pop(0)
            if self.exporter is not None and self.world.is_main:
                self.exporter(target, self.progress)

    # ---- logging, evaluation, keep-best ----------------------------------------------
    def _log_window(
        self,
        seconds: float,
        tracker: Any,
        on_log: Callable[[int, dict[str, float]], None] | None,
    ) -> dict[str, float]:
        """The means of the steps since the last log, logged; the window starts again."""
        n = self.window.pop("_steps")
        tps = self.window.pop("_tokens") / max(seconds, 1e-9)
        train = {f"train/{k}": v / n for k, v in self.window.items()}
        train["lr"] = train.pop("train/lr")
        train["tokens_per_s"] = tps
        self.window = {}
        if tracker is not None:
            tracker.log_metrics(train, step=self.step)
        if on_log is not None:
            on_log(self.step, train)
        return train

    def _evaluate_and_select(
        self,
        result: LoopResult,
        tracker: Any,
        on_eval: Callable[[Progress, dict[str, float]], None] | None,
        say: Callable[[str], None],
    ) -> bool:
        """Evaluate and log; with keep-best, keep improved weights. True: patience ran out."""
        scores = self.evaluate()
        result.eval = {f"eval/{k}": v for k, v in scores.items()}
        if tracker is not None and result.eval:
            tracker.log_metrics(result.eval, step=self.step)
        if on_eval is not None and scores:
            on_eval(self.progress, scores)
        if self.best is None:
            return False
        if self.best.offer(scores, self.engine.module):
            result.best_step, result.best = self.step, dict(scores)
        shown = ", ".join(f"{k} {v:.4f}" for k, v in scores.items())
        say(f"{self.settings.progress_label} step {self.step}: {shown}")
        return self.best.out_of_patience

    # ---- the loop -------------------------------------------------------------------
    def run(
        self,
        tracker: Any = None,
        on_log: Callable[[int, dict[str, float]], None] | None = None,
        on_eval: Callable[[Progress, dict[str, float]], None] | None = None,
    ) -> LoopResult:
        s = self.settings
        start, seconds_before = s.clock(), self.train_seconds
        last_log_t = time.monotonic()
        result = LoopResult(step=self.step, stopped_by="max_steps", tracker=tracker)
        if s.select and self.best is None:
            self.best = KeepBest(s.select, s.patience)
        if self.best is not None:
            self.best.stale = 0
        self._targets = [t for t in self._targets if t > self.tokens]  # reached before resume
        show = s.progress and self.world.is_main
        budgeted = bool(s.time_budget_s or s.max_tokens)
        # the bar shows how far the run is: by its budget, or by its planned steps where
        # those end it first (a bar of the budget alone stayed near 0 % to the last step)
        share = (lambda: max(self.budget_fraction(), self.step / s.max_steps)) if budgeted else None
        # a run resumed after its budget stopped it takes no step (the budget is checked after
        # a step, so each such resume trained one more step past it); every rank restored the
        # same tokens and seconds, so all decide alike
        if s.time_budget_s and self.train_seconds > s.time_budget_s:
            result.stopped_by = result.spent_before = "time_budget"
        elif s.max_tokens and self.tokens >= s.max_tokens:
            result.stopped_by = result.spent_before = "token_budget"
        steps = s.max_steps if not result.spent_before else self.step
        done = share() if share is not None else None
        with TrainProgress(s.max_steps, self.step, show, s.progress_label, done) as bar:
            while self.step < steps:
                self.train_seconds = self._agreed(seconds_before + s.clock() - start)
                over = s.time_budget_s is not None and self.train_seconds > s.time_budget_s
                led = self.budget.note(self.step + 1, self.train_seconds, self.tokens)
                if led and self.world.is_main:
                    bar.log(f"{s.progress_label} {led}")
                self._apply_budget_share()
                metrics, tokens, stop = self.train_step(over)
                self.step += 1
                self.tokens += tokens
                self.train_seconds = seconds_before + s.clock() - start
                self._export_reached()
                out_of_tokens = bool(s.max_tokens) and self.tokens >= s.max_tokens
                for k, v in metrics.items():
                    self.window[k] = self.window.get(k, 0.0) + v
                self.window["_steps"] = self.window.get("_steps", 0.0) + 1
                self.window["_tokens"] = self.window.get("_tokens", 0.0) + tokens
                final = stop or out_of_tokens or self.step >= s.max_steps
                if self.step % s.log_every == 0 or final:
                    now = time.monotonic()
                    result.train = self._log_window(now - last_log_t, tracker, on_log)
                    last_log_t = now
                    tps = result.train["tokens_per_s"]
                    loss = result.train["train/loss"]
                    bar.update(self.step, loss, tps, budget_share=share() if share else None)
                else:
                    bar.update(self.step, budget_share=share() if share else None)
                early = False
                if self.step % s.eval_every == 0 or final:
                    early = self._evaluate_and_select(result, tracker, on_eval, bar.log)
                if s.checkpoint_every and (self.step % s.checkpoint_every == 0 or final):
                    # the evaluation above is training time the next step would have counted
                    self.train_seconds = seconds_before + s.clock() - start
                    self.save()
                if stop or out_of_tokens or early:
                    if stop:
                        result.stopped_by, why = "time_budget", "time budget reached"
                    elif out_of_tokens:
                        result.stopped_by, why = "token_budget", "token budget reached"
                    else:
                        result.stopped_by, why = "early_stopping", f"no {s.select} gain, stopped"
                    bar.log(f"{why} at step {self.step}")
                    break
        if self.best is not None:
            self.best.restore(self.engine.module)
        result.step = self.step
        result.schedule = self.budget.tags()
        return result
