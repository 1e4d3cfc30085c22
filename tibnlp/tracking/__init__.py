"""Tracking: the MLflow convention (the only module that imports mlflow)."""
