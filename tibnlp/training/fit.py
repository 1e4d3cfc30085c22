"""A training run around the one loop (`loop.TrainLoop`): its resume and its MLflow run.

Apart from the loop, which knows nothing of how its run is opened or closed: pretraining
trains through `fit`; fine-tuning runs a loop per seed inside a run it opened itself."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tibnlp.errors import TibnlpError
from tibnlp.stopping import ended_status
from tibnlp.training import checkpoint
from tibnlp.training.loop import LoopResult, Progress, TrainLoop


def fit(
    loop: TrainLoop,
    resume: bool,
    open_tracker: Callable[[str | None], Any],
    on_log: Callable[[int, dict[str, float]], None] | None = None,
    on_eval: Callable[[Progress, dict[str, float]], None] | None = None,
) -> LoopResult:
    """Restore (if resuming), open the MLflow run on rank 0 (the same run when resuming), train.

    The tracker is returned open in the result so the caller can add the final artifacts; on
    an error it is closed FAILED (stopped: KILLED).
    """
    directory = loop.settings.checkpoint_dir
    checkpoint.require_resumable(directory, resume)
    if resume and not loop.restore():  # every complete checkpoint unreadable
        raise checkpoint.no_checkpoint(directory)
    if loop.step > loop.settings.max_steps:  # else: "12/4", exit 0, the 12-step model kept
        raise TibnlpError(
            f"--resume: the newest checkpoint in {directory} is at step {loop.step}, past "
            f"max_steps {loop.settings.max_steps}: there is nothing to continue",
            f"raise pretrain.max_steps above {loop.step} to train on; the model of that run "
            "is its OUTPUT/model",
        )
    tracker = open_tracker(loop.run_id) if loop.world.is_main else None
    if tracker is not None:
        loop.run_id = tracker.run_id
    try:
        result = loop.run(tracker, on_log, on_eval)
    except BaseException as exc:
        if tracker is not None:
            tracker.end(ended_status(exc))
        raise
    result.tracker = tracker
    return result
