"""A stage kind for tests/test_stopping.py: each process notes its pid, then waits to be
stopped. A module of its own, as a plugin's would be: launched workers import it to find it."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tibnlp.pipeline.context import StageContext
from tibnlp.pipeline.registry import register_stage


def _wait(ctx: StageContext) -> Path:
    rank = os.environ.get("RANK", "0")
    out = ctx.output / f"pid-{rank}"
    out.with_suffix(".tmp").write_text(str(os.getpid()), encoding="utf-8")
    out.with_suffix(".tmp").rename(out)
    time.sleep(300)
    return ctx.output


register_stage("s_sleep", _wait, ())
