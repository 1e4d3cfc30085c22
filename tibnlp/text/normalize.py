"""STAND-IN until the `text` branch lands (its module replaces this one at merge).

Only what fine-tuning needs: NFC, U+0F0C -> U+0F0B, and optionally syllables separated by
spaces joined with tsheg.
"""

from __future__ import annotations

import re
import unicodedata

_SPACED = re.compile("(?<=[\u0f40-\u0fbc])[ \t\u00a0]+(?=[\u0f40-\u0fbc])")


def normalize(text: str, join_spaced_syllables: bool = False) -> str:
    text = unicodedata.normalize("NFC", text).replace("\u0f0c", "\u0f0b")
    if join_spaced_syllables:
        text = _SPACED.sub("\u0f0b", text)
    text = re.sub("\u0f0b{2,}", "\u0f0b", text)
    return " ".join(text.split())
