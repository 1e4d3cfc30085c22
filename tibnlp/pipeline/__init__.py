"""Pipelines: stages chained from YAML, cached by content hash."""
