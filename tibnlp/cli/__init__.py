"""The `tibnlp` command line: one small module per command group, no logic of its own."""
