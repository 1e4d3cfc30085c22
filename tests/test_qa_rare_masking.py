"""QA of rare-first masking (`pretrain.mask_rarity`): the weighted order's statistics, its
resume safety, its interplay with whole words, pairs, [UNK] and ELECTRA, numerical edges, the
setting reaching only the training collator, and benchmarks/mlm_by_rarity.py's inputs."""

from __future__ import annotations

import inspect
import math
import random
import runpy
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tibetan_fixtures import TINY_MLM_RUN, prepared_inputs, pretrain_config_file

from tibnlp.config import load_config
from tibnlp.data import masking
from tibnlp.data.masking import (
    IGNORE_INDEX,
    MaskingIds,
    MlmCollator,
    rarity_log_weights,
    syllable_units,
)
from tibnlp.errors import DataError

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "mlm_by_rarity.py"
CLS, SEP, UNK = 2, 3, 1


class _Ids(MaskingIds):
    """Ids 0-4 special-like (score 0, as SentencePiece leaves them, [UNK] included); piece i
    >= 5 has log p = -1 - i / 10, so higher ids are rarer."""

    def piece_log_probs(self) -> list[float]:
        return [0.0 if i < 5 else -1.0 - i / 10 for i in range(self.size)]


class _Given(MaskingIds):
    """Ids with the log probabilities given (ids 0-4 scored 0)."""

    def __init__(self, log_p: list[float]) -> None:
        super().__init__(size=5 + len(log_p))
        object.__setattr__(self, "log_p", [0.0] * 5 + log_p)

    def piece_log_probs(self) -> list[float]:
        return list(self.log_p)  # type: ignore[attr-defined]


def _row(ids: list[int], starts: list[bool] | None = None) -> dict[str, Any]:
    starts = [True] * len(ids) if starts is None else starts
    return {
        "input_ids": ids,
        "token_type_ids": [0] * len(ids),
        "syllable_start": starts,
        "word_start": starts,
        "sop_label": 0,
    }


def _first_masked(collate: MlmCollator, ids: list[int], keys: range) -> list[int]:
    """The position masked in a row whose budget is one single-piece unit, per batch index."""
    out = []
    for key in keys:
        chosen = (collate([_row(ids)], key)["mlm_labels"][0] != IGNORE_INDEX).nonzero()
        assert len(chosen) == 1
        out.append(int(chosen[0]))
    return out


def test_the_first_unit_visited_has_probability_w_over_the_sum() -> None:
    """Efraimidis-Spirakis: P(unit i first) = w_i / sum(w), over many generator seeds."""
    log_p = [math.log(p) for p in (0.4, 0.2, 0.1, 0.05, 0.025)]  # w = 1/p: 2.5 .. 40
    collate = MlmCollator(_Given(log_p), mask_prob=0.1, max_ngram=1, seed=0, rarity=1.0)
    n = 3000
    first = _first_masked(collate, [CLS, 5, 6, 7, 8, 9, SEP], range(n))
    w = np.array([1 / math.exp(x) for x in log_p])
    for unit, share in enumerate(w / w.sum()):
        seen = first.count(unit + 1)
        assert abs(seen - n * share) < 4.5 * math.sqrt(n * share * (1 - share)), (unit, seen)


def test_the_order_is_a_function_of_seed_and_batch_index_only() -> None:
    """A fresh collator (a resumed run) reproduces batch k whatever was collated before."""
    rng = random.Random(1)
    rows = [_row([CLS, *(rng.randrange(5, 300) for _ in range(30)), SEP]) for _ in range(3)]
    ids = _Ids(size=300)
    busy = MlmCollator(ids, mask_prob=0.3, seed=7, rarity=2.0)
    for key in range(5):
        busy(rows, key)
    fresh = MlmCollator(ids, mask_prob=0.3, seed=7, rarity=2.0)
    a, b = busy(rows, 5), fresh(rows, 5)
    assert all(torch.equal(a[k], b[k]) for k in a)
    other = MlmCollator(ids, mask_prob=0.3, seed=8, rarity=2.0)(rows, 5)
    assert not torch.equal(a["mlm_labels"], other["mlm_labels"])


def test_unk_weighs_as_the_commonest_piece() -> None:
    """[UNK] and the specials carry score 0: weight 1, below every scored piece, so the
    budget goes to pieces whose prediction teaches something."""
    weights = rarity_log_weights([0.0] * 5 + [-1.0, -2.0, -3.0], 2.0)
    assert weights.tolist() == [0.0] * 5 + [2.0, 4.0, 6.0]
    collate = MlmCollator(_Ids(size=50), mask_prob=0.05, max_ngram=1, seed=3, rarity=30.0)
    ids = [CLS, *range(5, 12), UNK, *range(12, 20), SEP]
    assert ids.index(UNK) not in _first_masked(collate, ids, range(40))


def _check_batch(collate: MlmCollator, rows: list[dict[str, Any]], key: int) -> None:
    """Budget per row, whole units, no special token chosen."""
    labels = collate(rows, key)["mlm_labels"]
    if collate.split_pairs:
        rows = [half for row in rows for half in collate._split(row)]
    for r, row in enumerate(rows):
        special = [i in collate.special_ids for i in row["input_ids"]]
        chosen = [bool(labels[r, p] != IGNORE_INDEX) for p in range(len(special))]
        n_real = special.count(False)
        assert sum(chosen) <= (max(1, round(n_real * collate.mask_prob)) if n_real else 0)
        assert not any(c and s for c, s in zip(chosen, special, strict=True))
        for unit in syllable_units(row[collate.unit_column], special):
            assert len({chosen[p] for p in unit}) == 1


@pytest.mark.parametrize("whole_word", [False, True])
@pytest.mark.parametrize("split_pairs", [False, True])
def test_words_pairs_and_unk_keep_the_budget_and_whole_units(
    whole_word: bool, split_pairs: bool
) -> None:
    rng = random.Random(int(whole_word) * 2 + int(split_pairs))

    def example() -> dict[str, Any]:
        ids, syl, word = [CLS], [True], [True]
        for k in range(rng.randint(2, 14)):
            for j in range(rng.choice([1, 1, 2, 3])):
                ids.append(UNK if rng.random() < 0.1 else rng.randrange(5, 200))
                syl.append(j == 0)
                word.append(j == 0 and (k == 0 or rng.random() < 0.6))
            if k == 0:  # the A/B boundary split_pairs cuts at
                ids, syl, word = [*ids, SEP], [*syl, True], [*word, True]
        row = _row([*ids, SEP], [*syl, True])
        row["word_start"] = [*word, True]
        return row

    for rarity in (0.5, 1.0, 50.0):
        collate = MlmCollator(
            _Ids(size=200), 0.3, 3, 1, whole_word=whole_word, split_pairs=split_pairs, rarity=rarity
        )
        for key in range(15):
            _check_batch(collate, [example() for _ in range(rng.randint(1, 4))], key)


def test_numerical_edges() -> None:
    """A one-piece vocabulary, all-special and one-unit rows, huge and non-finite exponents."""
    tiny = MlmCollator(_Given([-0.5]), mask_prob=0.3, rarity=50.0)
    out = tiny([_row([CLS, 5, 5, SEP]), _row([CLS, SEP]), _row([CLS, 5, SEP])], 0)
    assert (out["mlm_labels"][1] == IGNORE_INDEX).all()
    assert int((out["mlm_labels"][2] != IGNORE_INDEX).sum()) == 1  # budget 1, the one unit
    only_special = tiny([_row([CLS, SEP]), _row([CLS, SEP, SEP])], 1)
    assert (only_special["mlm_labels"] == IGNORE_INDEX).all()
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="rarity"):
            MlmCollator(_Ids(size=50), rarity=bad)
    with pytest.raises(ValueError, match="mask_rarity"):  # p^-a past float64
        MlmCollator(_Ids(size=50), rarity=1e308)


def test_huge_exponent_keeps_equal_weights_in_random_order() -> None:
    """At an exponent where log w swamps log(E) in float64, equal-weight units still come in
    random order, not always the leftmost first."""
    collate = MlmCollator(_Given([-2.0]), mask_prob=0.1, max_ngram=1, rarity=1e300)
    first = _first_masked(collate, [CLS, *[5] * 8, SEP], range(40))
    assert len(set(first)) > 3


def test_a_zero_uniform_draw_is_no_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    """u = 0 (E = 0, log E = -inf) puts that unit first, quietly."""
    real_rand = torch.rand

    def zeros(*size: Any, generator: Any = None, dtype: Any = None) -> torch.Tensor:
        if dtype == torch.float64:
            return torch.zeros(*size, dtype=dtype)
        return real_rand(*size, generator=generator, dtype=dtype)

    monkeypatch.setattr(masking.torch, "rand", zeros)
    collate = MlmCollator(_Ids(size=50), mask_prob=0.1, max_ngram=1, rarity=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        labels = collate([_row([CLS, *range(5, 15), SEP])], 0)["mlm_labels"][0]
    assert int((labels != IGNORE_INDEX).sum()) == 1


@pytest.fixture(scope="module")
def electra(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tiny rare-first ELECTRA pretraining, recording each collator the run builds."""
    from tibnlp.training import pretrain

    made: list[dict[str, Any]] = []
    signature = inspect.signature(MlmCollator)

    class Recording(MlmCollator):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            made.append({**bound.arguments, "weighted": self._log_weight is not None})

    root = tmp_path_factory.mktemp("qa_rarity")
    inputs = prepared_inputs(root / "inputs", n_docs=60, heldout=20)
    extra = {"objective": "electra", "mask_rarity": 1.0, "eval_batches": 1, "eval_every": 1}
    cfg = pretrain_config_file(inputs, root / "out", TINY_MLM_RUN, "qa_rarity", **extra)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pretrain, "MlmCollator", Recording)
        out = pretrain.run_pretraining(load_config(cfg)).parent
    return {"out": out, "made": made}


def test_the_setting_reaches_the_training_collator_not_the_held_out_one(
    electra: dict[str, Any],
) -> None:
    made = electra["made"]
    assert [m["rarity"] for m in made if m["weighted"]] == [1.0]  # the training stream
    assert any(m["rarity"] == 0.0 and not m["weighted"] for m in made)  # held-out: uniform
    assert (electra["out"] / "model" / "model.safetensors").is_file()


def _bench(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["mlm_by_rarity.py", *argv])
    runpy.run_path(str(BENCH))["main"]()


def test_the_bands_hold_their_edges() -> None:
    bands = runpy.run_path(str(BENCH))["piece_bands"]
    counts = np.array([0, 19, 20, 199, 200, 1999, 2000, 10**6])
    assert bands(counts).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]


def test_the_benchmark_refuses_a_folder_that_is_no_pretraining_output(
    electra: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = str(electra["out"] / "model")
    with pytest.raises(DataError, match="not a pretraining output") as err:
        _bench(["--corpus", str(tmp_path), model], monkeypatch)
    assert str(tmp_path) in str(err.value)
    with pytest.raises(DataError, match="not a pretraining output") as err:
        _bench(["--corpus", model, model], monkeypatch)  # OUT/model, not OUT
    assert f"pass {electra['out']}" in (err.value.hint or "")


def test_the_benchmark_refuses_a_model_without_an_mlm_head(
    electra: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ELECTRA model has no MLM head of the encoder's width: no scores from a random one."""
    argv = ["--corpus", str(electra["out"]), str(electra["out"] / "model"), "--rows", "8"]
    with pytest.raises(DataError, match="not an MLM pretraining model"):
        _bench(argv, monkeypatch)
