"""A run's budget: the share of it spent, and which of its two clocks set the lr schedule.

A run may have a time budget, a token budget, or both. The share spent of whichever is further
along drives warmup and decay (`WarmupDecay.set_time_fraction`), so a budgeted run ends
annealed. With both set, a machine slower than the token budget's pace (`max_tokens /
time_budget_s` tokens/s) hands the schedule to the clock: the same config then trains another
schedule on a slower or busier machine, and its results differ from an idle machine's with
nothing in the config to say why. `BudgetWatch` records when and how far the clock led, says
so once in the log, and gives the run's `schedule_clock` tags, so such runs can be told apart.

With both budgets, the clock takes the schedule only once it leads by `LEAD_THRESHOLD` of the
budget (`clock_share`). If any lead counted, a slow step (warm-up, a busy second) would put
the time share a hair ahead and give the next steps a clock-set lr: two runs of one config on
an idle machine would train different models, both tagged `schedule_clock=tokens`. A run
whose clock never leads by that much trains the token schedule exactly, whatever its step
times.
"""

from __future__ import annotations

from dataclasses import dataclass

# The clock must lead the tokens by this share of the budget before it sets the lr: a slow
# first step (warm-up, JIT) puts it a hair ahead for a few steps, which must not change the run.
LEAD_THRESHOLD = 0.01


def clock_share(by_time: float) -> float:
    """The time share as the schedule reads it beside a token budget: 0 until the clock has
    spent `LEAD_THRESHOLD` of the budget, then rising to 1 at the budget's end (so a run the
    clock stops still ends annealed). It passes the token share only where the clock leads by
    `LEAD_THRESHOLD` x (1 - token share) or more."""
    return max(0.0, (by_time - LEAD_THRESHOLD) / (1.0 - LEAD_THRESHOLD))


@dataclass
class BudgetWatch:
    time_budget_s: float | None
    max_tokens: float  # 0: no token budget
    max_lead: float = 0.0  # the largest lead of the time share over the token share
    time_from_step: int = 0  # the first step whose lr the clock set (`clock_share`); 0: none

    def shares(self, seconds: float, tokens: float) -> tuple[float, float]:
        """(share of the time budget spent, share of the token budget spent); 0 without one."""
        by_time = seconds / self.time_budget_s if self.time_budget_s else 0.0
        by_tokens = tokens / self.max_tokens if self.max_tokens else 0.0
        return by_time, by_tokens

    def fraction(self, seconds: float, tokens: float) -> float:
        """Share of the budget spent: of whichever budget is further along (0: none); beside a
        token budget the clock counts only once it leads by `LEAD_THRESHOLD` (`clock_share`)."""
        by_time, by_tokens = self.shares(seconds, tokens)
        if self.time_budget_s and self.max_tokens:
            return max(by_tokens, clock_share(by_time))
        return max(by_time, by_tokens)

    def note(self, step: int, seconds: float, tokens: float) -> str | None:
        """Record the step about to be trained; returns the log line on the first step at
        which the clock, not the tokens, sets the lr (only when both budgets are set)."""
        if not (self.time_budget_s and self.max_tokens):
            return None
        by_time, by_tokens = self.shares(seconds, tokens)
        self.max_lead = max(self.max_lead, by_time - by_tokens)
        if self.fraction(seconds, tokens) <= by_tokens or self.time_from_step:
            return None
        self.time_from_step = step
        pace = self.max_tokens / self.time_budget_s
        rate = tokens / seconds if seconds > 0 else 0.0
        return (
            f"step {step}: {by_time:.1%} of the time budget is spent against {by_tokens:.1%} "
            f"of the token budget ({rate:,.0f} tokens/s, under the {pace:,.0f} tokens/s the "
            "two budgets imply). From here the clock sets the lr schedule, so this run trains "
            "another schedule than a faster or idle machine would (tag schedule_clock=time); "
            "for a schedule set by tokens alone, set pretrain.time_budget to ''"
        )

    def clock(self) -> str:
        """What set the schedule: "time" (the clock led at some point, or is the only budget),
        "tokens", or "steps" (no budget: max_steps)."""
        if self.time_budget_s and (not self.max_tokens or self.time_from_step):
            return "time"
        return "tokens" if self.max_tokens else "steps"

    def tags(self) -> dict[str, str]:
        """The run's tags: `schedule_clock`, and with both budgets how far the clock led."""
        tags = {"schedule_clock": self.clock()}
        if self.time_budget_s and self.max_tokens:
            tags["schedule_time_lead"] = f"{max(self.max_lead, 0.0):.4f}"
            if self.time_from_step:
                tags["schedule_time_from_step"] = str(self.time_from_step)
        return tags

    def state_dict(self) -> dict[str, float]:
        """Saved with each checkpoint (`TrainLoop.extra_state`): a resumed run keeps its record."""
        return {"max_lead": self.max_lead, "time_from_step": float(self.time_from_step)}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.max_lead = float(state.get("max_lead", 0.0))
        self.time_from_step = int(state.get("time_from_step", 0))
