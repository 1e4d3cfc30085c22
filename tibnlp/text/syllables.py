"""Tibetan characters and syllables: the units every stage counts in.

A syllable is a maximal run of Tibetan letters, vowel signs, subjoined letters and Tibetan
digits (U+0F00, U+0F18-19, U+0F20-33, U+0F35, U+0F37, U+0F39, U+0F3E-3F, U+0F40-0FBC, U+0FC6),
delimited by tsheg, shad, other punctuation, whitespace or any non-Tibetan character. This is
the definition used for the counts in the shared data's README, so our figures compare.
"""

from __future__ import annotations

import re

TSHEG = "\u0f0b"
NBSP_TSHEG = "\u0f0c"
SHAD = "\u0f0d"

_SYLLABLE_CHARS = "\u0f00\u0f18\u0f19\u0f20-\u0f33\u0f35\u0f37\u0f39\u0f3e\u0f3f\u0f40-\u0fbc\u0fc6"
SYLLABLE_RE = re.compile(f"[{_SYLLABLE_CHARS}]+")
_LETTER_RE = re.compile("[\u0f40-\u0fbc]")
_TIBETAN_RE = re.compile("[\u0f00-\u0fff]")


def syllables(text: str) -> list[str]:
    """The Tibetan syllables of `text`, in order (non-Tibetan words are not syllables)."""
    return SYLLABLE_RE.findall(text)


def count_syllables(text: str) -> int:
    return sum(1 for _ in SYLLABLE_RE.finditer(text))


def has_tibetan_letter(text: str) -> bool:
    return _LETTER_RE.search(text) is not None


def tibetan_ratio(text: str) -> float:
    """Share of Tibetan-block characters among the non-space characters (0.0 for none)."""
    chars = [c for c in text if not c.isspace()]
    if not chars:
        return 0.0
    return sum(1 for c in chars if _TIBETAN_RE.match(c)) / len(chars)
