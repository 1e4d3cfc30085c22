"""What a stage function receives."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tibnlp.config import Config
from tibnlp.tracking import Tracker


@dataclass
class StageContext:
    name: str  # node name, e.g. "pretrain[small=6]"
    stage: str  # stage name in the pipeline file
    variant: str
    config: Config  # fully resolved; `config.tracking.run_id` is this stage's MLflow run
    inputs: list[Path] | dict[str, Path]
    output: Path  # write here (a partial directory, published when the function returns)
    resume: bool  # the partial directory is left from an interrupted run
    tracker: Tracker
    params: dict[str, Any] = field(default_factory=dict)
