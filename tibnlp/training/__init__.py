"""Training: DeepSpeed engine set-up, checkpoints, the one step/eval/log loop."""
