"""Model soups: the weight average and Wortsman's greedy selection."""

from __future__ import annotations

import pytest
import torch

from tibnlp.training.soup import average_states, greedy_soup


def _state(value: float, count: int = 7) -> dict[str, torch.Tensor]:
    return {
        "w": torch.full((2, 3), value),
        "half": torch.full((2,), value, dtype=torch.bfloat16),
        "count": torch.tensor(count),
    }


def test_average_states_means_floats_in_their_dtype_and_keeps_integer_buffers() -> None:
    soup = average_states([_state(1.0, 7), _state(2.0, 9), _state(6.0, 11)])
    assert torch.equal(soup["w"], torch.full((2, 3), 3.0))
    assert soup["half"].dtype == torch.bfloat16 and torch.equal(
        soup["half"], torch.full((2,), 3.0, dtype=torch.bfloat16)
    )
    assert int(soup["count"]) == 7  # an integer buffer is not averaged: the first one's
    with pytest.raises(ValueError):
        average_states([])


def test_greedy_soup_starts_from_the_best_copy_and_adds_only_what_does_not_hurt() -> None:
    # a copy's value is its "weights"; a soup scores best at 1.5: the copy at 1.0 averaged
    # with the best one (2.0) raises the score and is kept, the one at 9.0 would lower it
    states = [_state(9.0), _state(2.0), _state(1.0)]
    scores = [0.5, 0.8, 0.7]

    def score_of(state: dict[str, torch.Tensor]) -> float:
        return 0.9 - abs(float(state["w"][0, 0]) - 1.5) / 10

    soup, kept, best = greedy_soup(states, scores, score_of)
    assert kept == [1, 2]  # best first, then the copy that does not lower the score
    assert float(soup["w"][0, 0]) == pytest.approx(1.5)
    assert best == pytest.approx(0.9)


def test_greedy_soup_of_one_copy_is_that_copy() -> None:
    state = _state(4.0)
    soup, kept, best = greedy_soup([state], [0.3], lambda s: pytest.fail("not scored"))
    assert soup is state and kept == [0] and best == 0.3
    with pytest.raises(ValueError):
        greedy_soup([state], [0.3, 0.4], lambda s: 0.0)
