"""Tracking: the MLflow convention. This package is the only place that imports mlflow.

Stages talk to `Tracker` only, so the convention (nested runs, flattened params, provenance
tags, buffering when the server is away) lives in one place.
"""

from tibnlp.tracking.tracker import Tracker, default_tracking_uri

__all__ = ["Tracker", "default_tracking_uri"]
