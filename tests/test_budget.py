"""Wall-clock budgets and the learning curve: the lr schedule follows the share of the budget
spent (a budgeted run ends annealed), and `export_at_tokens` hooks fire once per count."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import engine_harness as h
import pytest
import torch

from tibnlp.config import EngineConfig, OptimizerConfig
from tibnlp.training.budget import LEAD_THRESHOLD, BudgetWatch, clock_share
from tibnlp.training.engine import init_distributed
from tibnlp.training.learning_check import LearningCheck
from tibnlp.training.loop import LoopSettings, Progress, TrainLoop
from tibnlp.training.pretrain_record import export_name
from tibnlp.training.schedule import lr_factor
from tibnlp.training.wiring import start_training


def test_time_share_drives_warmup_and_decay() -> None:
    # 10 % warmup; 1000 planned steps but the budget is what ends the run.
    assert lr_factor(0, 100, 1000, "linear", time_fraction=0.05) == pytest.approx(0.5)
    assert lr_factor(0, 100, 1000, "linear", time_fraction=0.55) == pytest.approx(0.5)
    assert lr_factor(0, 100, 1000, "linear", time_fraction=1.0) == 0.0
    assert lr_factor(0, 100, 1000, "cosine", 0.1, time_fraction=1.0) == pytest.approx(0.1)
    # Steps further along than time: steps win.
    assert lr_factor(550, 100, 1000, "linear", time_fraction=0.2) == pytest.approx(0.5)


def _loop(tmp: Path, settings: LoopSettings, exports: list) -> TrainLoop:
    world = init_distributed(EngineConfig(threads=1))
    torch.manual_seed(0)
    cfg = OptimizerConfig(lr=1e-2, warmup_steps=100, schedule="linear")
    training = start_training(h.TinyPretrainer(), EngineConfig(threads=1), cfg, 8, 0, 1000, world)
    ids, lengths = h.examples(0)
    train = training.batches(h.make_plan(8, 0), h.make_collate(ids, lengths, 0), 8)
    return training.loop(train, None, settings, exporter=lambda t, at: exports.append((t, at)))


def _settings(tmp: Path, max_steps: int = 1000, **budget: Any) -> LoopSettings:
    """Checkpoints, evaluation and logging out of the way: only the budget under test."""
    return LoopSettings(
        max_steps=max_steps,
        log_every=1000,
        eval_every=1000,
        eval_batches=0,
        checkpoint_every=0,
        keep_checkpoints=0,
        checkpoint_dir=tmp / "ck",
        progress=False,
        **budget,
    )


def _record_lrs(loop: TrainLoop) -> list[float]:
    """The lr each training step of `loop` is about to use, appended as it runs."""
    lrs: list[float] = []
    real_step = loop.train_step

    def step(over: bool):  # type: ignore[no-untyped-def]
        lrs.append(loop.engine.optimizer.param_groups[0]["lr"])
        return real_step(over)

    loop.train_step = step  # type: ignore[method-assign]
    return lrs


def test_budgeted_run_ends_at_the_final_lr(tmp_path: Path) -> None:
    now = [0.0]

    def clock() -> float:  # one simulated second per training step (two reads per step)
        now[0] += 0.5
        return now[0]

    settings = _settings(tmp_path, time_budget_s=20.0, clock=clock)
    exports: list[tuple[float, Progress]] = []
    loop = _loop(tmp_path, settings, exports)
    lrs = _record_lrs(loop)
    result = loop.run()
    assert result.stopped_by == "time_budget" and 19 <= result.step <= 22
    assert lrs[0] == pytest.approx(1e-2 * 0.25, rel=0.3)  # warmup: 10 % of the budget
    assert max(lrs) == pytest.approx(1e-2, rel=0.2)
    assert lrs[-2] < 1e-2 * 0.1  # annealed, although 2 % of the planned steps ran
    assert loop.train_seconds == pytest.approx(result.step * 1.0, abs=1.5)


def test_exports_fire_once_per_token_count(tmp_path: Path) -> None:
    settings = _settings(tmp_path, max_steps=6, export_at_tokens=[1.0, 2.0, 1e12])
    exports: list[tuple[float, Progress]] = []
    loop = _loop(tmp_path, settings, exports)
    loop.run()
    assert [t for t, _ in exports] == [1.0, 2.0]  # both reached at step 1; 1e12 never
    assert exports[0][1].step == 1 and 0 < exports[0][1].tokens < loop.tokens
    assert export_name(2_000_000.0) == "tokens-2000000"


class _Tags:
    def __init__(self) -> None:
        self.tags: dict[str, str] = {}

    def set_tags(self, tags: dict[str, str]) -> None:
        self.tags.update(tags)


def test_learning_check_warns_once_at_the_unigram_plateau(capsys) -> None:  # type: ignore[no-untyped-def]
    check = LearningCheck(unigram=0.10, warn_after=0.25, share=lambda at: at.step / 100)
    check.tracker = _Tags()  # type: ignore[assignment]
    check(Progress(10, 0, 0), {"mask_accuracy": 0.11})  # too early to judge
    assert not check.warned
    check(Progress(30, 0, 0), {"mask_accuracy": 0.30})  # learning
    assert not check.warned
    check(Progress(40, 0, 0), {"mask_accuracy": 0.12})
    assert check.warned and check.tracker.tags["warning"] == "not_learning"  # type: ignore[attr-defined]
    assert "unigram level" in capsys.readouterr().err
    check(Progress(50, 0, 0), {"mask_accuracy": 0.12})
    assert capsys.readouterr().err == ""  # once


def test_token_budget_stops_the_run_annealed(tmp_path: Path) -> None:
    settings = _settings(tmp_path, max_tokens=2000.0)
    loop = _loop(tmp_path, settings, [])
    result = loop.run()
    assert result.stopped_by == "token_budget" and loop.tokens >= 2000
    assert loop.tokens - 2000 < loop.tokens / result.step + 1  # stopped at the first step past
    assert loop.budget_fraction() >= 1.0
    assert loop.engine.optimizer.param_groups[0]["lr"] < 1e-2 * 0.15  # decayed with the tokens


def test_progress_counts_the_budget_not_the_planned_steps(capsys) -> None:  # type: ignore[no-untyped-def]
    from tibnlp.training.progress import TrainProgress

    with TrainProgress(100_000, 0, True, "pretrain", budget_share=0.0) as bar:
        bar.update(10, 5.0, 1000.0, budget_share=0.25)
    err = capsys.readouterr().err
    assert "step 10, 25.0% of budget" in err and "/100000" not in err


def test_progress_of_a_budgeted_run_that_max_steps_ends(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """A run with a time budget it never nears ends at max_steps: its bar counted the budget
    alone and stayed near 0 % to the end (ETA hours too far)."""
    settings = _settings(tmp_path, max_steps=6, time_budget_s=3600.0)
    settings.progress = True
    result = _loop(tmp_path, settings, []).run()
    assert result.stopped_by == "max_steps"
    err = " ".join(capsys.readouterr().err.split())
    assert "step 6, 100.0% of budget" in err


def test_budget_watch_says_when_the_clock_takes_the_schedule() -> None:
    """Both budgets set: the schedule follows whichever share is further along, so a machine
    under the budgets' pace trains another schedule; the watch says so once, with the step."""
    watch = BudgetWatch(time_budget_s=100.0, max_tokens=1000.0)  # pace: 10 tokens/s
    assert watch.note(1, 0.5, 0.0) is None  # a slow first step: under the threshold
    assert watch.note(2, 10.0, 120.0) is None and watch.clock() == "tokens"
    line = watch.note(3, 20.0, 150.0)  # 7.5 tokens/s: the clock leads by 5 points
    assert line is not None and "step 3" in line and "pretrain.time_budget" in line
    assert watch.note(4, 30.0, 200.0) is None  # once
    assert watch.fraction(30.0, 200.0) == pytest.approx(clock_share(0.3))
    assert watch.tags() == {
        "schedule_clock": "time",
        "schedule_time_lead": "0.1000",
        "schedule_time_from_step": "3",
    }
    resumed = BudgetWatch(time_budget_s=100.0, max_tokens=1000.0)
    resumed.load_state_dict(watch.state_dict())
    assert resumed.tags() == watch.tags()
    assert BudgetWatch(None, 1000.0).tags() == {"schedule_clock": "tokens"}
    assert BudgetWatch(60.0, 0.0).tags() == {"schedule_clock": "time"}
    assert BudgetWatch(None, 0.0).tags() == {"schedule_clock": "steps"}


@pytest.mark.parametrize(("seconds_per_step", "clock_name"), [(1.0, "time"), (1e-4, "tokens")])
def test_the_run_records_which_budget_set_its_schedule(
    tmp_path: Path, seconds_per_step: float, clock_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same config on a slow and on a fast (simulated) machine: the slow one's schedule
    follows the clock, the run's result says which, and its log says so once."""
    now = [0.0]

    def clock() -> float:  # two reads per step
        now[0] += seconds_per_step / 2
        return now[0]

    probe = _loop(tmp_path / "probe", _settings(tmp_path / "probe", max_steps=1), [])
    probe.run()
    per_step = probe.tokens  # tokens of one step of the harness's batches
    settings = _settings(tmp_path, time_budget_s=20.0, max_tokens=30 * per_step, clock=clock)
    settings.progress = True
    capsys.readouterr()
    result = _loop(tmp_path, settings, []).run()
    said = " ".join(capsys.readouterr().err.split()).count("the clock sets the lr schedule")
    assert said == (1 if clock_name == "time" else 0)
    assert result.schedule["schedule_clock"] == clock_name
    assert ("schedule_time_from_step" in result.schedule) == (clock_name == "time")
    expected = "time_budget" if clock_name == "time" else "token_budget"
    assert result.stopped_by == expected


def test_a_lead_under_the_threshold_leaves_the_token_schedule() -> None:
    """Beside a token budget the clock counts only once it leads by LEAD_THRESHOLD; a run it
    stops still ends annealed, and a time budget alone is read as it is."""
    watch = BudgetWatch(time_budget_s=100.0, max_tokens=1000.0)
    assert watch.fraction(0.9, 0.0) == 0.0  # the seconds before the first token
    assert watch.fraction(4.0, 33.0) == 0.033  # a slow first step: the time share 0.04
    assert watch.note(2, 4.0, 33.0) is None and watch.clock() == "tokens"
    assert watch.fraction(100.0, 500.0) == 1.0  # the clock's end: annealed
    lead = LEAD_THRESHOLD * (1 - 0.5)  # where the clock takes over at half the tokens
    assert watch.fraction(100.0 * (0.5 + lead) - 1e-6, 500.0) == 0.5
    assert watch.fraction(100.0 * (0.5 + lead) + 0.1, 500.0) > 0.5
    assert BudgetWatch(100.0, 0.0).fraction(0.9, 0.0) == pytest.approx(0.009)


def test_step_times_do_not_change_a_run_the_tokens_govern(tmp_path: Path) -> None:
    """Two runs of one config, one with a slow first step (4 % of the time budget, under the
    token share after it plus LEAD_THRESHOLD): the same lr at every step, the same weights.
    When any lead counted, the slow run's next steps took their lr from the clock."""
    probe = _loop(tmp_path / "probe", _settings(tmp_path / "probe", max_steps=1), [])
    probe.run()
    per_step = probe.tokens

    def run(first_step_s: float, name: str) -> tuple[list[float], list[torch.Tensor]]:
        reads = [0]

        def clock() -> float:  # the start, then two reads per step: the first step's end
            reads[0] += 1  # is the third read, and that step takes first_step_s
            return 1e-3 * reads[0] + (first_step_s if reads[0] >= 3 else 0.0)

        budget = {"time_budget_s": 100.0, "max_tokens": 30 * per_step, "clock": clock}
        loop = _loop(tmp_path / name, _settings(tmp_path / name, **budget), [])
        lrs = _record_lrs(loop)
        result = loop.run()
        assert result.stopped_by == "token_budget"
        assert result.schedule["schedule_clock"] == "tokens"
        return lrs, [p.detach().clone() for p in loop.engine.module.parameters()]

    fast_lrs, fast_weights = run(1e-3, "fast")
    slow_lrs, slow_weights = run(4.0, "slow")
    assert slow_lrs == fast_lrs
    assert all(torch.equal(a, b) for a, b in zip(fast_weights, slow_weights, strict=True))
