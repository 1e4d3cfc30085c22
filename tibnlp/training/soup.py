"""Model soups (Wortsman et al. 2022): fine-tune several copies of one start, average weights.

Copies fine-tuned from the same pretrained start (and, with LP-FT, the same probed head) stay in
one basin of the loss, so the average of their weights is one model that scores like an
ensemble of them, at one model's inference cost. The greedy soup keeps only the copies that
help: copies sorted by validation macro-F1, each added to the average when the soup's
validation macro-F1 does not fall. A random start has no such basin (the copies of a random
encoder drift apart), which is why the lever is one that pretraining can win from.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

State = dict[str, torch.Tensor]


def average_states(states: Sequence[State]) -> State:
    """The mean of floating-point tensors (computed in fp32, stored in each tensor's dtype);
    integer buffers (counts, ids) are taken from the first state."""
    if not states:
        raise ValueError("average_states needs at least one state")
    first = states[0]
    out: State = {}
    for name, tensor in first.items():
        if tensor.is_floating_point():
            total = torch.zeros_like(tensor, dtype=torch.float32)
            for state in states:
                total += state[name].float()
            out[name] = (total / len(states)).to(tensor.dtype)
        else:
            out[name] = tensor.clone()
    return out


def greedy_soup(
    states: Sequence[State], scores: Sequence[float], score_of: Callable[[State], float]
) -> tuple[State, list[int], float]:
    """Wortsman's greedy soup. `scores`: each state's own validation score; `score_of` scores
    an averaged state on validation. Returns the soup, the indices it holds (best first) and
    its validation score. Ties keep the copy: a soup of more copies is the flatter point."""
    if len(states) != len(scores) or not states:
        raise ValueError("greedy_soup needs one score per state, at least one state")
    order = sorted(range(len(states)), key=lambda i: -scores[i])
    kept, best = [order[0]], scores[order[0]]
    soup = states[order[0]]
    for i in order[1:]:
        candidate = average_states([states[j] for j in [*kept, i]])
        score = score_of(candidate)
        if score >= best:
            kept, best, soup = [*kept, i], score, candidate
    return soup, kept, best
