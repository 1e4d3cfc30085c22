"""Keep-best selection and early stopping, as fine-tuning uses them: the weights of the
evaluation that scored highest on one metric are kept (a copy in memory, not a checkpoint:
a fine-tuning seed reruns whole) and put back when training ends, and training stops once
`patience` evaluations in a row have not beaten it."""

from __future__ import annotations

import torch


class KeepBest:
    def __init__(self, metric: str, patience: int = 0) -> None:
        self.metric, self.patience = metric, patience
        self.value: float | None = None
        self.stale = 0  # evaluations since the best
        self._state: dict[str, torch.Tensor] | None = None

    def offer(self, metrics: dict[str, float], module: torch.nn.Module) -> bool:
        """Keep `module`'s weights when the metric improved (True: they were kept)."""
        if self.metric not in metrics:
            raise TypeError(
                f"loop setting select={self.metric!r}: the evaluation gave {sorted(metrics)}"
            )
        value = metrics[self.metric]
        if self.value is None or value > self.value:  # (a NaN never beats, nor is beaten)
            self.value, self.stale = value, 0
            self._state = {k: v.detach().clone() for k, v in module.state_dict().items()}
            return True
        self.stale += 1
        return False

    @property
    def out_of_patience(self) -> bool:
        return bool(self.patience) and self.stale >= self.patience

    def restore(self, module: torch.nn.Module) -> None:
        if self._state is not None:
            module.load_state_dict(self._state)
