"""Per-document work of corpus preparation (run in `datasets.map` workers) and the corpus-wide
steps after it: exact sentence dedup and the held-out split by document.

A line is dropped when, after `normalize`, it is empty (`empty`), holds no Tibetan letter or
less than `min_tibetan_ratio` Tibetan characters among its non-space characters
(`too_little_tibetan`), or fewer than `min_syllables` syllables (`too_few_syllables`). Kept
lines are split into sentences; a sentence never spans two lines.
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from typing import Any

import numpy as np

from tibnlp.text.normalize import normalize
from tibnlp.text.sentences import split_sentences
from tibnlp.text.syllables import SYLLABLE_RE

LINE_REASONS = ("empty", "too_little_tibetan", "too_few_syllables")
_NON_TIBETAN_RE = re.compile(r"[^\u0f00-\u0fff\s]")
_SPACE_RE = re.compile(r"\s")
_LETTER_RE = re.compile("[\u0f40-\u0fbc]")


def count_syllables(text: str) -> int:
    """`syllables.count_syllables`, faster (findall in C instead of a Python generator)."""
    return len(SYLLABLE_RE.findall(text))


def line_drop_reason(
    line: str, min_tibetan_ratio: float, min_syllables: int, syllables: int | None = None
) -> str | None:
    """Why a normalised line is dropped, or None to keep it (reasons: `LINE_REASONS`).

    `syllables`: the line's syllable count when already known (it is not recounted)."""
    if not line:
        return "empty"
    if _LETTER_RE.search(line) is None:
        return "too_little_tibetan"
    visible = len(line) - len(_SPACE_RE.findall(line))
    if (visible - len(_NON_TIBETAN_RE.findall(line))) < min_tibetan_ratio * visible:
        return "too_little_tibetan"
    if (count_syllables(line) if syllables is None else syllables) < min_syllables:
        return "too_few_syllables"
    return None


def sentence_key(sentence: str) -> int:
    """64-bit key for exact dedup (a collision among 10^7 sentences has odds ~10^-5)."""
    digest = hashlib.blake2b(sentence.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def process_documents(
    batch: dict[str, list[Any]],
    join_spaced_syllables: bool,
    min_tibetan_ratio: float,
    min_syllables: int,
    ga_boundary: bool,
) -> dict[str, list[Any]]:
    """`datasets.map(batched=True)` function: raw `lines` -> normalised, filtered `sentences`,
    with per-sentence syllable counts and dedup keys, and per-document drop counts."""
    out: dict[str, list[Any]] = {
        "sentences": [],
        "syllables": [],
        "keys": [],
        **{f"dropped_{r}": [] for r in LINE_REASONS},
    }
    for lines in batch["lines"]:
        sentences: list[str] = []
        dropped = dict.fromkeys(LINE_REASONS, 0)
        syllables: list[int] = []
        for raw in lines:
            line = normalize(raw, join_spaced_syllables)
            reason = line_drop_reason(line, min_tibetan_ratio, 0)
            if reason is None:
                # Sentences partition the line (a syllable never spans a shad or a space), so
                # the line's syllables are the sum of its sentences'.
                parts = split_sentences(line, ga_boundary)
                counts = [count_syllables(s) for s in parts]
                if sum(counts) >= min_syllables:
                    sentences += parts
                    syllables += counts
                    continue
                reason = "too_few_syllables"
            dropped[reason] += 1
        out["sentences"].append(sentences)
        out["syllables"].append(syllables)
        out["keys"].append([sentence_key(s) for s in sentences])
        for reason, n in dropped.items():
            out[f"dropped_{reason}"].append(n)
    return out


def dedup_mask(
    keys: list[int], seen: set[int], min_syllables: int, syllables: list[int]
) -> list[bool]:
    """Which sentences to keep: first occurrences only (in corpus order), updating `seen`.

    Sentences shorter than `min_syllables` are never treated as duplicates (formulaic short
    sentences are part of a document's text, not boilerplate)."""
    keep = []
    for key, n in zip(keys, syllables, strict=True):
        if n < min_syllables:
            keep.append(True)
        elif key in seen:
            keep.append(False)
        else:
            seen.add(key)
            keep.append(True)
    return keep


def choose_heldout(doc_sources: dict[int, str], fraction: float, seed: int) -> set[int]:
    """Held-out documents: `fraction` of each source's documents (rounded), drawn with `seed`.

    Stratifying by source keeps every genre in the held-out set in proportion. When rounding
    leaves it empty although `fraction > 0` and there are two or more documents, one document
    is drawn from the whole corpus, so the held-out split is never empty by accident.
    """
    if fraction <= 0 or len(doc_sources) < 2:
        return set()
    rng = np.random.default_rng(seed)
    by_source: dict[str, list[int]] = defaultdict(list)
    for doc_id, source in sorted(doc_sources.items()):
        by_source[source].append(doc_id)
    chosen: set[int] = set()
    for source in sorted(by_source):
        ids = by_source[source]
        k = round(fraction * len(ids))
        if k:
            chosen.update(int(i) for i in rng.choice(ids, size=k, replace=False))
    if not chosen:
        chosen.add(int(rng.choice(sorted(doc_sources))))
    return chosen
