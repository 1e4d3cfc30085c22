"""Settings of experiment tracking (MLflow)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TrackingConfig:
    uri: str = ""  # empty: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the working dir
    experiment: str = "tibnlp"
    run_name: str = ""
    enabled: bool = True
