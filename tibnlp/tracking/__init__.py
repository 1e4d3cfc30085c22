"""Tracking: the MLflow convention. This package is the only place that imports mlflow.

Stages talk to `Tracker` only, so the convention (nested runs, flattened params, provenance
tags, buffering when the server is away) lives in one place.
"""

from tibnlp.tracking.conventions import git_commit, path_hash, provenance_tags
from tibnlp.tracking.outbox import TrackingOutageWarning
from tibnlp.tracking.store import default_tracking_uri, require_store
from tibnlp.tracking.sync import sync_buffers
from tibnlp.tracking.tracker import (
    PrefixedRun,
    Tracker,
    tracker_from_config,
)

__all__ = [
    "PrefixedRun",
    "Tracker",
    "TrackingOutageWarning",
    "default_tracking_uri",
    "git_commit",
    "path_hash",
    "provenance_tags",
    "require_store",
    "sync_buffers",
    "tracker_from_config",
]
