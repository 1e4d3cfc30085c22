"""ALBERT n-gram masking over whole syllables: shares, 80/10/10, 1/n, specials, determinism."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from tibnlp.config import load_config
from tibnlp.data.masking import (
    IGNORE_INDEX,
    MaskingIds,
    MlmCollator,
    ngram_probs,
    sample_spans,
    syllable_units,
)
from tibnlp.errors import ConfigError

IDS = MaskingIds(size=1000)
CLS, SEP = 2, 3


def _example(rng: random.Random, n_a: int, n_b: int, unit_p: float = 0.6) -> dict:
    """[CLS] A [SEP] B [SEP] with random tokens and ~1/unit_p pieces per syllable."""
    a = [rng.randrange(5, IDS.size) for _ in range(n_a)]
    b = [rng.randrange(5, IDS.size) for _ in range(n_b)]
    ids = [CLS, *a, SEP, *b, SEP]
    starts = [True] + [rng.random() < unit_p for _ in a] + [True]
    starts += [rng.random() < unit_p for _ in b] + [True]
    starts[1] = starts[n_a + 2] = True  # a segment opens a syllable
    return {
        "input_ids": ids,
        "token_type_ids": [0] * (n_a + 2) + [1] * (n_b + 1),
        "syllable_start": starts,
        "sop_label": rng.randint(0, 1),
    }


def _batches(n_batches: int = 40, batch: int = 8, seed: int = 0) -> list[list[dict]]:
    rng = random.Random(seed)
    return [
        [_example(rng, rng.randint(20, 250), rng.randint(20, 250)) for _ in range(batch)]
        for _ in range(n_batches)
    ]


@pytest.fixture(scope="module")
def masked() -> list[tuple[list[dict], dict[str, torch.Tensor]]]:
    collate = MlmCollator(IDS, seed=7)
    return [(exs, collate(exs, i)) for i, exs in enumerate(_batches())]


def test_batch_shapes_and_padding(masked: list) -> None:
    examples, out = masked[0]
    width = max(len(e["input_ids"]) for e in examples)
    for key in ("input_ids", "attention_mask", "token_type_ids", "mlm_labels"):
        assert out[key].shape == (len(examples), width) and out[key].dtype == torch.long
    assert out["sop_labels"].tolist() == [e["sop_label"] for e in examples]
    for row, ex in enumerate(examples):
        n = len(ex["input_ids"])
        assert out["attention_mask"][row].tolist() == [1] * n + [0] * (width - n)
        assert (out["input_ids"][row, n:] == IDS.pad_id).all()
        assert (out["mlm_labels"][row, n:] == IGNORE_INDEX).all()
        assert out["token_type_ids"][row, :n].tolist() == ex["token_type_ids"]


def test_masked_share_is_15_percent(masked: list) -> None:
    chosen = real = 0
    for examples, out in masked:
        chosen += int((out["mlm_labels"] != IGNORE_INDEX).sum())
        real += sum(len(e["input_ids"]) - 3 for e in examples)
    assert chosen / real == pytest.approx(0.15, abs=0.005)


def test_80_10_10_split(masked: list) -> None:
    counts: Counter[str] = Counter()
    for examples, out in masked:
        for row, ex in enumerate(examples):
            n = len(ex["input_ids"])
            labels, got = out["mlm_labels"][row, :n], out["input_ids"][row, :n]
            sel = labels != IGNORE_INDEX
            assert (labels[sel] == torch.tensor(ex["input_ids"])[sel]).all()  # label = original
            counts["mask"] += int((got[sel] == IDS.mask_id).sum())
            counts["kept"] += int((got[sel] == labels[sel]).sum())
            counts["total"] += int(sel.sum())
            replaced = got[sel][(got[sel] != IDS.mask_id) & (got[sel] != labels[sel])]
            assert ((replaced >= 5) & (replaced < IDS.size)).all()  # never a special/[UNK]
    total = counts["total"]
    assert total > 10_000  # tolerances below are ~3 standard errors
    assert counts["mask"] / total == pytest.approx(0.8, abs=0.01)
    # kept includes the ~0.1% of random draws that hit the original token
    assert counts["kept"] / total == pytest.approx(0.1, abs=0.008)
    assert (total - counts["mask"] - counts["kept"]) / total == pytest.approx(0.1, abs=0.008)


def test_special_tokens_are_never_masked(masked: list) -> None:
    for examples, out in masked:
        for row, ex in enumerate(examples):
            for pos, tok in enumerate(ex["input_ids"]):
                if tok in (CLS, SEP):
                    assert out["mlm_labels"][row, pos] == IGNORE_INDEX
                    assert out["input_ids"][row, pos] == tok


def test_spans_start_and_end_on_syllable_boundaries(masked: list) -> None:
    for examples, out in masked:
        for row, ex in enumerate(examples):
            starts, n = ex["syllable_start"], len(ex["input_ids"])
            sel = (out["mlm_labels"][row, :n] != IGNORE_INDEX).tolist()
            for pos in range(1, n):
                if sel[pos] and not sel[pos - 1]:
                    assert starts[pos], "a masked run begins mid-syllable"
                if sel[pos - 1] and not sel[pos]:
                    assert starts[pos], "a masked run ends mid-syllable"


def test_ngram_lengths_follow_one_over_n() -> None:
    g = torch.Generator().manual_seed(0)
    lengths: Counter[int] = Counter()
    for _ in range(300):
        units = [[i] for i in range(500)]
        lengths.update(len(s) for s in sample_spans(units, 75, ngram_probs(3), g))
    total = sum(lengths.values())
    expected = ngram_probs(3).tolist()  # 6/11, 3/11, 2/11
    assert total > 10_000 and set(lengths) == {1, 2, 3}
    # budget trimming and overlap skipping favour short spans slightly (as in ALBERT)
    for n in (1, 2, 3):
        assert lengths[n] / total == pytest.approx(expected[n - 1], abs=0.03)


def test_spans_are_whole_units_and_disjoint() -> None:
    g = torch.Generator().manual_seed(1)
    units = syllable_units([True, False, True, True, False, False] * 50, [False] * 300)
    assert [len(u) for u in units[:3]] == [2, 1, 3]
    spans = sample_spans(units, 45, ngram_probs(3), g)
    flat = [u for s in spans for u in s]
    assert len(flat) == len(set(flat))
    assert all(s == list(range(s[0], s[0] + len(s))) and len(s) <= 3 for s in spans)
    assert 40 <= sum(len(units[u]) for u in flat) <= 45  # fills the token budget, never over


def test_units_skip_special_tokens() -> None:
    units = syllable_units(
        [True, True, False, True, True, False], [True, False, False, True] + [False] * 2
    )
    assert units == [[1, 2], [4, 5]]


def test_masking_is_a_pure_function_of_seed_and_batch_index() -> None:
    batch = _batches(1)[0]
    a = MlmCollator(IDS, seed=3)(batch, 17)
    b = MlmCollator(IDS, seed=3)(batch, 17)  # a fresh collator, as after a resume
    for key in a:
        assert torch.equal(a[key], b[key])
    other_batch = MlmCollator(IDS, seed=3)(batch, 18)
    other_seed = MlmCollator(IDS, seed=4)(batch, 17)
    assert not torch.equal(a["mlm_labels"], other_batch["mlm_labels"])
    assert not torch.equal(a["mlm_labels"], other_seed["mlm_labels"])


def _reference_chosen(collate: MlmCollator, examples: list[dict], key: int) -> torch.Tensor:
    """The tokens to predict, row by row with the readable per-row functions: each row's units
    (`syllable_units`), then its spans (`sample_spans`), from the collator's generator."""
    g = collate.generator(key)
    width = max(len(e["input_ids"]) for e in examples)
    chosen = torch.zeros((len(examples), width), dtype=torch.bool)
    for row, ex in enumerate(examples):
        special = [int(i) in collate.special_ids for i in ex["input_ids"]]
        units = syllable_units(list(ex[collate.unit_column]), special)
        budget = round((len(special) - sum(special)) * collate.mask_prob)
        for span in sample_spans(units, max(1, budget), collate.probs, g):
            for u in span:
                chosen[row, units[u]] = True
    return chosen


@pytest.mark.parametrize("whole_word", [False, True])
def test_batched_collator_equals_the_per_row_algorithm(whole_word: bool) -> None:
    """The collator lays a batch out as arrays and draws spans per row (host time per step);
    what it picks must be exactly what the per-row reference picks."""
    rng = random.Random(5)
    for key, examples in enumerate(_batches(12, seed=3)):
        for ex in examples:  # words: runs of 1-3 syllables
            ex["word_start"] = [s and rng.random() < 0.6 for s in ex["syllable_start"]]
            ex["word_start"][1] = True
        collate = MlmCollator(IDS, mask_prob=0.3, seed=11, whole_word=whole_word)
        out = collate(examples, key)
        assert torch.equal(
            out["mlm_labels"] != IGNORE_INDEX, _reference_chosen(collate, examples, key)
        )


def test_rejects_bad_settings() -> None:
    with pytest.raises(ValueError):
        MlmCollator(IDS, mask_prob=0.0)
    with pytest.raises(ValueError):
        MlmCollator(IDS, max_ngram=0)


class _ScoredIds(MaskingIds):
    """Ids with unigram log probabilities, as a `Vocabulary` gives them: id i has log p
    -1 - i / 100, so higher ids are rarer."""

    def piece_log_probs(self) -> list[float]:
        return [-1.0 - i / 100 for i in range(self.size)]


SCORED = _ScoredIds(size=1000)


def _chosen(collate: MlmCollator, batches: list[list[dict]]) -> list[torch.Tensor]:
    return [collate(exs, i)["mlm_labels"] != IGNORE_INDEX for i, exs in enumerate(batches)]


def test_rare_first_masking_keeps_the_budget_and_favours_rare_units() -> None:
    """`pretrain.mask_rarity`: the same number of pieces per row, whole syllables only, and
    rarer units predicted more often than under the uniform order."""
    batches = _batches(10)
    uniform = _chosen(MlmCollator(SCORED, mask_prob=0.3, seed=5), batches)
    rare = _chosen(MlmCollator(SCORED, mask_prob=0.3, seed=5, rarity=1.0), batches)
    mean_id = {"uniform": [], "rare": []}
    for exs, u, r in zip(batches, uniform, rare, strict=True):
        assert u.sum(dim=1).tolist() == r.sum(dim=1).tolist()  # the same budget per row
        ids = torch.full(u.shape, 0)
        for row, ex in enumerate(exs):
            ids[row, : len(ex["input_ids"])] = torch.tensor(ex["input_ids"])
            special = [i in IDS.special_ids for i in ex["input_ids"]]
            for unit in syllable_units(ex["syllable_start"], special):  # never split
                assert len({bool(r[row, p]) for p in unit}) == 1
        mean_id["uniform"].append(ids[u].float().mean())
        mean_id["rare"].append(ids[r].float().mean())
    # uniform ids average ~500; rare-first shifts what is predicted toward the high ids
    assert sum(mean_id["rare"]) / 10 > sum(mean_id["uniform"]) / 10 + 100


def test_rare_first_masking_weighs_a_unit_by_its_rarest_piece() -> None:
    """A row of one two-piece syllable with a rare piece among many common one-piece syllables:
    with a strong exponent, the rare syllable is always among the first picked."""
    ids = [CLS, 5, 999, *range(6, 46), SEP]
    starts = [True, True, False, *[True] * 40, True]
    ex = {"input_ids": ids, "token_type_ids": [0] * len(ids), "syllable_start": starts}
    ex["sop_label"] = 0
    collate = MlmCollator(SCORED, mask_prob=0.1, max_ngram=1, seed=1, rarity=20.0)
    for key in range(20):
        labels = collate([ex], key)["mlm_labels"][0]
        assert labels[1] == 5 and labels[2] == 999  # the unit is masked whole


def test_rare_first_masking_off_is_the_uniform_masking() -> None:
    batch = _batches(1)[0]
    a = MlmCollator(SCORED, seed=3)(batch, 4)
    b = MlmCollator(SCORED, seed=3, rarity=0.0)(batch, 4)
    for key in a:
        assert torch.equal(a[key], b[key])


def test_rare_first_masking_needs_log_probs() -> None:
    with pytest.raises(ValueError, match="Vocabulary"):
        MlmCollator(IDS, rarity=0.5)
    with pytest.raises(ValueError, match="rarity"):
        MlmCollator(SCORED, rarity=-1.0)
    with pytest.raises(ConfigError, match=r"pretrain\.mask_rarity"):
        load_config(None, ["pretrain.mask_rarity=-0.5"])
    with pytest.raises(ConfigError, match=r"pretrain\.mask_rarity.*\[0, 100\]"):
        load_config(None, ["pretrain.mask_rarity=101"])  # p^-a overflows far past it
    assert load_config(None, ["pretrain.mask_rarity=0.5"]).pretrain.mask_rarity == 0.5
