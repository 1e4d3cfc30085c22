"""Skip-gram word vectors as the word embedding's start (`pretrain.skipgram`): the pairs
word2vec would draw, vectors that reflect co-occurrence, the cache a resumed run reads back,
and a pretraining run that starts from them and counts their cost."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from test_pretrain import _config_file
from tibetan_fixtures import prepared_inputs

from tibnlp.config import load_config
from tibnlp.config.train import SkipgramConfig
from tibnlp.errors import ConfigError
from tibnlp.models import read_extra
from tibnlp.models.io import load_pretrained
from tibnlp.training import skipgram
from tibnlp.training.skipgram import (
    cached_vectors,
    embedding_init,
    epoch_pairs,
    flatten,
    keep_probability,
    train_skipgram,
)


def test_pairs_stay_inside_a_sequence_and_the_window() -> None:
    ids, owner = flatten([[2, 10, 11, 12, 3], [2, 20, 21, 3], [2, 30, 3]], exclude={2, 3})
    assert ids.tolist() == [10, 11, 12, 20, 21, 30] and owner.tolist() == [0, 0, 0, 1, 1, 2]
    keep = np.ones(40)
    pairs = epoch_pairs(ids, owner, keep, window=1, rng=np.random.default_rng(0))
    # window 1: every neighbour pair, both ways, and nothing across sequences
    assert sorted(map(tuple, pairs.tolist())) == sorted(
        [(10, 11), (11, 10), (11, 12), (12, 11), (20, 21), (21, 20)]
    )
    wide = epoch_pairs(ids, owner, keep, window=5, rng=np.random.default_rng(0))
    assert {(a // 10, b // 10) for a, b in wide.tolist()} <= {(1, 1), (2, 2)}
    assert (10, 12) in set(map(tuple, wide.tolist()))  # distance 2 counts with prob 4/5


def test_distant_contexts_count_less_often() -> None:
    ids = np.arange(20000)  # distinct pieces: a pair's id difference is its distance
    owner = np.zeros_like(ids)
    pairs = epoch_pairs(ids, owner, np.ones(20000), window=4, rng=np.random.default_rng(1))
    distance = np.abs(pairs[:, 0] - pairs[:, 1])
    counts = [int((distance == d).sum()) for d in (1, 2, 3, 4, 5)]
    expected = [2 * (20000 - d) * (4 - d + 1) / 4 for d in (1, 2, 3, 4)] + [0]
    assert counts == pytest.approx(expected, rel=0.05)


def test_subsampling_thins_frequent_pieces_only() -> None:
    counts = np.array([0, 1, 10, 1_000_000], dtype=float)
    keep = keep_probability(counts, 1e-4)
    assert keep[1] == keep[2] == 1.0 and keep[3] < 0.02
    assert keep_probability(counts, 0.0).tolist() == [1.0] * 4


def _topics(n: int, seed: int = 0) -> list[list[int]]:
    """Sequences of one topic each: pieces 10-19 occur together, 20-29 together."""
    rng = np.random.default_rng(seed)
    return [
        [2, *rng.integers(10 + 10 * (i % 2), 20 + 10 * (i % 2), size=12).tolist(), 3]
        for i in range(n)
    ]


def test_vectors_reflect_which_pieces_occur_together() -> None:
    cfg = SkipgramConfig(epochs=3, window=3, negatives=3, subsample=0.0, lr=0.02, batch_pairs=256)
    result = train_skipgram(_topics(400), 40, 16, cfg, seed=0, exclude={2, 3})
    v = torch.nn.functional.normalize(result.vectors, dim=1)
    a, b = v[10:20], v[20:30]
    within = ((a @ a.T).sum() - 10) / 90 + ((b @ b.T).sum() - 10) / 90
    across = 2 * (a @ b.T).mean()
    assert within.item() > across.item() + 0.5
    assert not result.vectors[[0, 2, 3, 30]].any()  # special and unseen pieces: zero rows
    assert result.pairs > 0 and result.flops == 6.0 * 16 * (1 + 3) * result.pairs
    assert result.loss < np.log(2) * (1 + 3)  # below an untrained model's loss


def test_training_leaves_the_global_rng_alone() -> None:
    """A run that trains the vectors and one that reads them from its cache must draw the same
    unseen rows in embedding_init (from the global RNG) and so start from the same weights."""
    cfg = SkipgramConfig(epochs=1, window=2, negatives=2, batch_pairs=128)
    torch.manual_seed(5)
    before = torch.random.get_rng_state()
    first = train_skipgram(_topics(50), 40, 8, cfg, seed=0, exclude={2, 3})
    assert torch.equal(torch.random.get_rng_state(), before)
    torch.manual_seed(6)  # another global state: the same vectors
    assert torch.equal(train_skipgram(_topics(50), 40, 8, cfg, 0, {2, 3}).vectors, first.vectors)


def test_embedding_init_is_centred_at_the_asked_scale() -> None:
    vectors = torch.randn(50, 8) * 3 + 5
    vectors[40:] = 0.0  # pieces the corpus never had
    table = embedding_init(vectors, 0.1)
    assert table[:40].mean(dim=0).abs().max().item() < 1e-5
    assert table[:40].std().item() == pytest.approx(0.1, rel=1e-4)
    assert 0 < table[40:].std().item() < 0.3  # random rows of the same scale, not zeros
    cos = torch.nn.functional.cosine_similarity
    centred = vectors[:40] - vectors[:40].mean(dim=0)
    assert torch.allclose(cos(table[:40], centred, dim=1), torch.ones(40), atol=1e-5)


def test_cached_vectors_are_read_back_unless_a_setting_changed(tmp_path, monkeypatch) -> None:
    cfg = SkipgramConfig(epochs=1, window=2, negatives=2, batch_pairs=128)
    first = cached_vectors(tmp_path, lambda: _topics(50), 40, 8, cfg, 0, {2, 3}, key="data-a")

    def refuse(*_args, **_kwargs):
        raise AssertionError("trained again")

    monkeypatch.setattr(skipgram, "train_skipgram", refuse)
    again = cached_vectors(tmp_path, lambda: _topics(50), 40, 8, cfg, 0, {2, 3}, key="data-a")
    assert torch.equal(first.vectors, again.vectors) and first.flops == again.flops
    for changed in ({"key": "data-b"}, {"seed": 1}):
        args = {"key": "data-a", "seed": 0, **changed}
        with pytest.raises(AssertionError, match="trained again"):
            cached_vectors(
                tmp_path, lambda: _topics(50), 40, 8, cfg, args["seed"], {2, 3}, key=args["key"]
            )


def test_skipgram_and_init_from_exclude_each_other() -> None:
    with pytest.raises(ConfigError, match=r"pretrain\.skipgram\.epochs"):
        load_config(None, ["pretrain.skipgram.epochs=2", "pretrain.init_from=runs/m"])
    with pytest.raises(ConfigError, match=r"pretrain\.skipgram\.window"):
        load_config(None, ["pretrain.skipgram.window=0"])


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepared_inputs(tmp_path_factory.mktemp("skipgram_inputs"), n_docs=120, heldout=20)


def test_pretraining_starts_from_the_vectors_and_counts_their_cost(inputs, tmp_path) -> None:
    from tibnlp.training.pretrain import run_pretraining

    out = tmp_path / "run"
    sg = {"epochs": 2, "window": 3, "negatives": 2, "batch_pairs": 512, "std": 0.1}
    # a rate so small that two MLM steps leave the embedding where the vectors put it
    cfg = load_config(_config_file(inputs, out, max_steps=2, skipgram=sg, optimizer={"lr": 1e-9}))
    model_dir = run_pretraining(cfg)
    facts = read_extra(model_dir)
    vectors = torch.load(out / "skipgram" / skipgram.VECTORS_FILE)
    seen = vectors.abs().sum(dim=1) > 0
    _, state = load_pretrained(model_dir)
    word = state["encoder.embeddings.word.weight"]
    expected = embedding_init(vectors, 0.1)
    assert seen.sum() > 20
    assert torch.allclose(word[seen], expected[seen], atol=1e-5)
    assert facts["skipgram_flops"] > 0 and facts["skipgram_pairs"] > 0
    mlm_flops = facts["tokens"] * facts["flops_per_token"]
    assert facts["flops"] == pytest.approx(mlm_flops + facts["skipgram_flops"])
    # a model continued from it (the title stage) inherits the warm start's record
    cont = load_config(
        _config_file(inputs, tmp_path / "cont", max_steps=2, init_from=str(model_dir))
    )
    continued = read_extra(run_pretraining(cont))
    assert continued["skipgram_flops"] == facts["skipgram_flops"]
    assert continued["flops"] > facts["flops"]


def test_piece_ngrams_are_fasttexts_hashed_character_ngrams() -> None:
    pieces = ["[PAD]", "\u2581abc", "abcd", "x"]
    grams = skipgram.piece_ngrams(pieces, buckets=50, n_min=3, n_max=4, exclude={0})
    own = [grams.rows[grams.starts[i]] for i in range(4)]
    assert own == [0, 1, 2, 3]  # every piece's own row first
    assert grams.lengths.tolist() == [1, 1 + 3 + 2, 1 + 3 + 2, 1]  # "<abc>": 3 of 3, 2 of 4
    assert (grams.rows[grams.starts[1] + 1 : grams.starts[2]] >= 4).all()  # the buckets after
    assert (grams.rows < 4 + 50).all()
    # the same n-gram, the same row: "abc" and "bc>" are in both; "<ab" only in the word start
    first = set(grams.rows[grams.starts[1] + 1 : grams.starts[2]].tolist())
    second = set(grams.rows[grams.starts[2] + 1 : grams.starts[3]].tolist())
    assert len(first & second) >= 1
    again = skipgram.piece_ngrams(pieces, buckets=50, n_min=3, n_max=4, exclude={0})
    assert again.rows.tolist() == grams.rows.tolist()  # no salted hash: every process agrees
    flat, offsets = grams.bags(np.array([3, 1]))
    assert offsets.tolist() == [0, 1] and flat.tolist()[:2] == [3, 1]


def test_ngrams_give_a_rare_piece_the_topic_of_its_spelling() -> None:
    # pieces 10-19 are spelt "cat?" and 20-29 "dog?"; piece 30, "catz", occurs in one sequence
    # only: without n-grams it keeps an almost untrained vector, with them it joins 10-19
    pieces = [f"[S{i}]" for i in range(10)]
    pieces += [f"\u2581cat{chr(97 + i)}" for i in range(10)]
    pieces += [f"\u2581dog{chr(97 + i)}" for i in range(10)]
    pieces += ["\u2581catz"] + [f"[U{i}]" for i in range(9)]
    sequences = [*_topics(400), [2, 30, 20, 21, 3]]  # its one context is even the other topic
    base = SkipgramConfig(epochs=3, window=3, negatives=3, subsample=0.0, lr=0.02, batch_pairs=256)
    cfg = SkipgramConfig(**{**base.__dict__, "ngram_buckets": 500})

    def lean(result: skipgram.SkipgramResult) -> float:
        v = torch.nn.functional.normalize(result.vectors, dim=1)
        return float((v[30] @ v[10:20].T).mean() - (v[30] @ v[20:30].T).mean())

    plain = train_skipgram(sequences, 40, 16, base, seed=0, exclude={2, 3})
    sub = train_skipgram(sequences, 40, 16, cfg, seed=0, exclude={2, 3}, pieces=pieces)
    assert lean(sub) > 0.3 and lean(sub) > lean(plain) + 0.3
    assert not sub.vectors[[0, 2, 3, 31]].any()  # special and unseen pieces: still zero rows
    assert sub.flops > 6.0 * 16 * (1 + 3) * sub.pairs  # the n-gram rows are counted


def test_ngram_settings_key_the_cache_only_when_on(tmp_path, monkeypatch) -> None:
    import json

    cfg = SkipgramConfig(epochs=1, window=2, negatives=2, batch_pairs=128)
    cached_vectors(tmp_path, lambda: _topics(50), 40, 8, cfg, 0, {2, 3}, key="k")
    saved = json.loads((tmp_path / skipgram.FACTS_FILE).read_text())["settings"]
    assert "ngram_buckets" not in saved  # caches from before n-grams are read back as before

    def refuse(*_args, **_kwargs):
        raise AssertionError("trained again")

    monkeypatch.setattr(skipgram, "train_skipgram", refuse)
    with pytest.raises(AssertionError, match="trained again"):
        on = SkipgramConfig(**{**cfg.__dict__, "ngram_buckets": 64})
        cached_vectors(tmp_path, lambda: _topics(50), 40, 8, on, 0, {2, 3}, "k", ["p"] * 40)


def test_ngram_keys_are_checked_at_load() -> None:
    for bad, key in [
        ("pretrain.skipgram.ngram_buckets=-1", "ngram_buckets"),
        ("pretrain.skipgram.ngram_min=0", "ngram_min"),
        ("pretrain.skipgram.ngram_max=2", "ngram_max"),
    ]:
        with pytest.raises(ConfigError, match=rf"pretrain\.skipgram\.{key}"):
            load_config(None, [bad])
    with pytest.raises(ValueError, match="pieces"):
        on = SkipgramConfig(epochs=1, ngram_buckets=8)
        train_skipgram(_topics(5), 40, 8, on, 0, {2, 3})
