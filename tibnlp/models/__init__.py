"""Models: pure `nn.Module`s built from `ModelConfig` (no training, tracking or CLI imports)."""
