"""Settings of experiment tracking (MLflow)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tibnlp.config.core import check


@dataclass
class TrackingConfig:
    uri: str = ""  # empty: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the working dir
    experiment: str = "tibnlp"
    run_name: str = ""
    enabled: bool = True
    # Set by `tibnlp pipeline run`: the stage's run (log into it) and the pipeline's parent run.
    run_id: str = ""
    parent_run_id: str = ""
    tags: dict[str, str] = field(default_factory=dict)
    # Where calls are buffered while the store is unreachable (empty: .tibnlp/tracking-buffer)
    buffer_dir: str = ""
    retry_seconds: float = 30.0  # how often a buffering tracker probes the store again
    # a fine-tuning (a pipeline stage, or a standalone `tibnlp finetune`) registers its best
    # seed on validation under this name (tibnlp.training.registration; empty: none)
    register_model: str = ""

    def validate(self, prefix: str) -> None:
        check(self.retry_seconds >= 0, f"{prefix}.retry_seconds", "must be >= 0")
