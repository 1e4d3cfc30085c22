"""Skip-gram with negative sampling (word2vec; Mikolov et al. 2013) over the pretraining
corpus's pieces: a warm start for the encoder's word embedding (`pretrain.skipgram`).

Why: on a CPU budget MLM passes over the corpus about once, so a piece seen a few dozen times
gets only a few dozen noisy updates of its embedding. A skip-gram epoch over the same tokens
costs about 6 x E x (1 + negatives) FLOPs per (centre, context) pair, some 1e-3 of an MLM
token's, so several epochs give every piece a vector learned from all of its contexts before
the first MLM step. `benchmarks/results/skipgram.md` measures what that buys.

The pairs follow word2vec: frequent pieces are subsampled (keep probability
sqrt(t/f) + t/f), a context at distance o <= window counts with probability
(window - o + 1) / window (word2vec's random window, in expectation), and pairs never cross
an example. Training is batched: SparseAdam on the mean loss, the rate decayed linearly to 0.

With `ngram_buckets` > 0 a centre piece is the mean of its own row and the rows of its
character n-grams, hashed into buckets (fastText; Bojanowski et al. 2017): a piece seen a few
times borrows from the pieces that share its spelling. Why try it: the encoder's lead over its
twin lives in titles whose pieces are rare in the corpus too (`lead_by_rarity.md`).
"""

from __future__ import annotations

import json
import math
import sys
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tibnlp.config.train import SkipgramConfig
from tibnlp.fsutil import atomic_file
from tibnlp.text.vocab import WORD_START

VECTORS_FILE = "vectors.pt"
FACTS_FILE = "skipgram.json"


@dataclass
class SkipgramResult:
    """`vectors` [V, dim] (rows of excluded ids are zero); `flops`: analytic training FLOPs;
    `seconds`: training time; `loss`: mean loss of the last epoch, per pair."""

    vectors: torch.Tensor
    pairs: int
    flops: float
    seconds: float
    loss: float

    def facts(self) -> dict[str, float]:
        return {
            "skipgram_pairs": float(self.pairs),
            "skipgram_flops": self.flops,
            "skipgram_seconds": round(self.seconds, 3),
            "skipgram_loss": round(self.loss, 5),
        }


def flatten(sequences: Iterable[Sequence[int]], exclude: set[int]) -> tuple[np.ndarray, np.ndarray]:
    """All pieces of all sequences in order, without `exclude` (special pieces), and the index
    of the sequence each came from (pairs stay inside one sequence)."""
    ids: list[np.ndarray] = []
    owner: list[np.ndarray] = []
    drop = np.array(sorted(exclude), dtype=np.int64)
    for i, seq in enumerate(sequences):
        arr = np.asarray(seq, dtype=np.int64)
        arr = arr[~np.isin(arr, drop)]
        ids.append(arr)
        owner.append(np.full(len(arr), i, dtype=np.int64))
    if not ids:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(ids), np.concatenate(owner)


def keep_probability(counts: np.ndarray, threshold: float) -> np.ndarray:
    """word2vec's subsampling: a piece of corpus frequency f is kept with
    min(1, sqrt(t/f) + t/f); threshold 0 keeps everything."""
    if threshold <= 0:
        return np.ones(len(counts))
    freq = counts / max(counts.sum(), 1)
    with np.errstate(divide="ignore"):
        ratio = np.where(freq > 0, threshold / freq, np.inf)
    return np.minimum(1.0, np.sqrt(ratio) + ratio)


@dataclass
class PieceNgrams:
    """Each piece's rows in a table of vocab_size + buckets (+1 padding) rows, ragged: piece i
    owns `rows[starts[i] : starts[i] + lengths[i]]`, its own row first."""

    rows: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray

    def bags(self, ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """EmbeddingBag's (input, offsets) for the pieces `ids`."""
        lengths = self.lengths[ids]
        offsets = np.zeros(len(ids), dtype=np.int64)
        np.cumsum(lengths[:-1], out=offsets[1:])
        flat = np.repeat(self.starts[ids] - offsets, lengths) + np.arange(int(lengths.sum()))
        return torch.from_numpy(self.rows[flat]), torch.from_numpy(offsets)


def piece_ngrams(
    pieces: Sequence[str], buckets: int, n_min: int, n_max: int, exclude: set[int]
) -> PieceNgrams:
    """The hashed character n-grams of every piece, fastText-style: the piece framed by "<"
    (its leading "▁", a word start, or nothing) and ">", n-grams of n_min..n_max characters,
    each hashed (CRC-32 of its UTF-8: the same rows in every process) into one of `buckets`
    rows after the vocabulary's. `exclude` (special pieces) keep their own row only."""
    vocab = len(pieces)
    rows: list[int] = []
    starts = np.zeros(vocab, dtype=np.int64)
    lengths = np.zeros(vocab, dtype=np.int64)
    for i, piece in enumerate(pieces):
        starts[i] = len(rows)
        rows.append(i)
        if i not in exclude:
            framed = ("<" + piece[1:] if piece.startswith(WORD_START) else piece) + ">"
            grams = {
                framed[a : a + n]
                for n in range(n_min, n_max + 1)
                for a in range(len(framed) - n + 1)
            }
            rows += sorted(vocab + zlib.crc32(g.encode("utf-8")) % buckets for g in grams)
        lengths[i] = len(rows) - starts[i]
    return PieceNgrams(np.asarray(rows, dtype=np.int64), starts, lengths)


def epoch_pairs(
    ids: np.ndarray, owner: np.ndarray, keep: np.ndarray, window: int, rng: np.random.Generator
) -> np.ndarray:
    """[P, 2] shuffled (centre, context) pairs of one epoch, after subsampling."""
    kept = rng.random(len(ids)) < keep[ids]
    ids, owner = ids[kept], owner[kept]
    parts = []
    for o in range(1, window + 1):
        same = owner[:-o] == owner[o:]
        take = same & (rng.random(len(same)) < (window - o + 1) / window)
        left, right = ids[:-o][take], ids[o:][take]
        parts.append(np.stack([left, right], axis=1))
        parts.append(np.stack([right, left], axis=1))
    pairs = np.concatenate(parts) if parts else np.zeros((0, 2), np.int64)
    return pairs[rng.permutation(len(pairs))]


def train_skipgram(
    sequences: Iterable[Sequence[int]],
    vocab_size: int,
    dim: int,
    cfg: SkipgramConfig,
    seed: int,
    exclude: set[int],
    report: Callable[[str], None] | None = None,
    pieces: Sequence[str] = (),
) -> SkipgramResult:
    """Train word vectors of width `dim` on `sequences` of piece ids (see the module doc);
    `pieces`, the vocabulary's strings, are needed when `cfg.ngram_buckets` > 0."""
    ngrams = None
    if cfg.ngram_buckets:
        if len(pieces) != vocab_size:
            raise ValueError(f"subword n-grams need the {vocab_size} pieces, got {len(pieces)}")
        ngrams = piece_ngrams(pieces, cfg.ngram_buckets, cfg.ngram_min, cfg.ngram_max, exclude)
    ids, owner = flatten(sequences, exclude)
    counts = np.bincount(ids, minlength=vocab_size).astype(np.float64)
    if len(ids) < 2:
        raise ValueError("skip-gram needs at least two pieces of text")
    keep = keep_probability(counts, cfg.subsample)
    noise = torch.from_numpy(counts**0.75)
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)

    # filled from `gen` below: the default init would draw from the global RNG, which then
    # differs between a run that trains the vectors and one that reads them from its cache
    # (embedding_init draws the unseen rows from it next)
    rows = vocab_size + cfg.ngram_buckets
    inputs: nn.Embedding | nn.EmbeddingBag = (
        nn.Embedding(rows, dim, sparse=True, _weight=torch.empty(rows, dim))
        if ngrams is None
        else nn.EmbeddingBag(rows, dim, mode="mean", sparse=True, _weight=torch.empty(rows, dim))
    )
    outputs = nn.Embedding(vocab_size, dim, sparse=True, _weight=torch.empty(vocab_size, dim))
    with torch.no_grad():
        inputs.weight.uniform_(-0.5 / dim, 0.5 / dim, generator=gen)
        outputs.weight.zero_()
    mean_rows = 0.0 if ngrams is None else float(ngrams.lengths[ids].mean())  # per token

    def centre_vectors(centres: torch.Tensor) -> torch.Tensor:  # [B] -> [B, E]
        if ngrams is None:
            return inputs(centres)
        return inputs(*ngrams.bags(centres.numpy()))

    params = [inputs.weight, outputs.weight]
    optimizer = torch.optim.SparseAdam(params, lr=cfg.lr)
    # the schedule needs the epoch's size before it is drawn: the expected pair count
    expected = 2.0 * float(keep[ids].sum()) * (cfg.window + 1) / 2.0
    total_steps = max(1, math.ceil(cfg.epochs * expected / cfg.batch_pairs))

    started = time.monotonic()
    step, pairs_seen, last_report = 0, 0, started
    loss_sum, loss_pairs = 0.0, 0
    for epoch in range(cfg.epochs):
        pairs = torch.from_numpy(epoch_pairs(ids, owner, keep, cfg.window, rng))
        loss_sum, loss_pairs = 0.0, 0
        for start in range(0, len(pairs), cfg.batch_pairs):
            batch = pairs[start : start + cfg.batch_pairs]
            lr = cfg.lr * max(1.0 - step / total_steps, 1e-4)
            for group in optimizer.param_groups:
                group["lr"] = lr
            neg = torch.multinomial(noise, len(batch) * cfg.negatives, True, generator=gen)
            centre = centre_vectors(batch[:, 0])  # [B, E]
            context = outputs(torch.cat([batch[:, 1:2], neg.view(len(batch), -1)], dim=1))
            scores = torch.einsum("bd,bkd->bk", centre, context)  # [B, 1 + K]
            sign = torch.ones_like(scores)
            sign[:, 1:] = -1.0
            loss = -F.logsigmoid(sign * scores).sum(dim=1)
            optimizer.zero_grad()
            loss.mean().backward()
            optimizer.step()
            step += 1
            loss_sum += float(loss.detach().sum())
            loss_pairs += len(batch)
            pairs_seen += len(batch)
            now = time.monotonic()
            if report is not None and now - last_report >= 30:
                last_report = now
                rate = pairs_seen / (now - started)
                left = max(total_steps - step, 0) * cfg.batch_pairs / rate
                report(
                    f"skipgram epoch {epoch + 1}/{cfg.epochs} loss {loss_sum / loss_pairs:.4f} "
                    f"{rate / 1e6:.2f} M pairs/s ETA {left / 60:.1f} min"
                )
        if report is not None:
            report(
                f"skipgram epoch {epoch + 1}/{cfg.epochs} loss {loss_sum / max(loss_pairs, 1):.4f}"
            )
    with torch.no_grad():
        vectors = torch.cat(
            [centre_vectors(chunk) for chunk in torch.arange(vocab_size).split(4096)]
        )
    vectors[torch.from_numpy(counts == 0)] = 0.0
    flops = 6.0 * dim * (1 + cfg.negatives) * pairs_seen
    if ngrams is not None:  # the centre's rows averaged, their gradient spread: 2 x E a row
        flops += 2.0 * dim * mean_rows * pairs_seen
    return SkipgramResult(
        vectors=vectors,
        pairs=pairs_seen,
        flops=flops,
        seconds=time.monotonic() - started,
        loss=loss_sum / max(loss_pairs, 1),
    )


def embedding_init(vectors: torch.Tensor, std: float) -> torch.Tensor:
    """The vectors as an embedding table: centred and scaled to per-component `std`.

    The encoder's input path normalises (LayerNorm) so scale does not matter there, but the
    MLM decoder is tied to this table: `std` sets how large its first logits are and how many
    Adam steps of MLM it takes to move a row as far as its own scale."""
    seen = vectors.abs().sum(dim=1) > 0
    out = vectors - vectors[seen].mean(dim=0)
    out = out * (std / out[seen].std())
    out[~seen] = torch.randn(int((~seen).sum()), vectors.shape[1]) * std
    return out


def cache_settings(
    vocab_size: int, dim: int, cfg: SkipgramConfig, seed: int, key: str
) -> dict[str, object]:
    """What a cached result in OUTPUT/skipgram was trained with (compared on reading it)."""
    settings = {**asdict(cfg), "dim": dim, "seed": seed, "vocab_size": vocab_size, "key": key}
    if not cfg.ngram_buckets:  # word2vec: the settings (and caches) from before n-grams existed
        for name in ("ngram_buckets", "ngram_min", "ngram_max"):
            del settings[name]
    return settings


def read_cached(folder: Path) -> tuple[dict[str, object], SkipgramResult] | None:
    """(settings, result) of the vectors cached in `folder`, whatever their settings; None
    when there are none."""
    facts_path, vectors_path = folder / FACTS_FILE, folder / VECTORS_FILE
    if not (facts_path.is_file() and vectors_path.is_file()):
        return None
    saved = json.loads(facts_path.read_text(encoding="utf-8"))
    r = saved["result"]
    result = SkipgramResult(
        torch.load(vectors_path), int(r["pairs"]), r["flops"], r["seconds"], r["loss"]
    )
    return saved.get("settings", {}), result


def cached_vectors(
    folder: Path,
    sequences: Callable[[], Iterable[Sequence[int]]],
    vocab_size: int,
    dim: int,
    cfg: SkipgramConfig,
    seed: int,
    exclude: set[int],
    key: str,
    pieces: Sequence[str] = (),
) -> SkipgramResult:
    """`train_skipgram`, or its result from `folder` when trained before with the same
    settings and data `key` (a resumed pretraining does not train them again)."""
    settings = cache_settings(vocab_size, dim, cfg, seed, key)
    facts_path, vectors_path = folder / FACTS_FILE, folder / VECTORS_FILE
    saved = read_cached(folder)
    if saved is not None and saved[0] == settings:
        return saved[1]
    result = train_skipgram(
        sequences(),
        vocab_size,
        dim,
        cfg,
        seed,
        exclude,
        lambda line: print(line, file=sys.stderr),
        pieces,
    )
    folder.mkdir(parents=True, exist_ok=True)
    # the facts vouch for the vectors beside them: gone first, so a run stopped between the
    # two writes leaves no record of other settings over these vectors (read back as theirs)
    facts_path.unlink(missing_ok=True)
    with atomic_file(vectors_path) as tmp:
        torch.save(result.vectors, tmp)
    record = {
        "settings": settings,
        "result": {
            "pairs": result.pairs,
            "flops": result.flops,
            "seconds": result.seconds,
            "loss": result.loss,
        },
    }
    with atomic_file(facts_path) as tmp:
        tmp.write_text(json.dumps(record, indent=1), encoding="utf-8")
    return result
