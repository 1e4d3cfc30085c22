"""Datasets: the data directory, manifests, task loaders and pretraining examples."""
