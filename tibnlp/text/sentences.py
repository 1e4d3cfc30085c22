"""Sentence splitting on shad, for sentence-order prediction and per-sentence dedup.

Tibetan marks the end of a clause or sentence with a shad. On `normalize`d text a sentence
ends after a run of shad characters (U+0F0D shad, U+0F0E nyis shad, U+0F0F tsheg shad,
U+0F10 nyis tsheg shad, U+0F11 rin chen spungs shad, U+0F12 rgya gram shad, U+0F14 gter tsheg),
spaces inside the run included, so the double shad "། །" ends one sentence and is kept with it:
"ལོ། །བདག་ནི། །" -> ["ལོ། །", "བདག་ནི། །"]. Closing quotes or brackets right after the shad
("།”") stay with the sentence they close. One shad between two Tibetan digits ("༡༠།༠༠", a
time; "༢།༦", a decimal) is part of the number, not a sentence end.

A sentence ending in the syllable ག or ཀ usually carries no shad: a space follows instead
("འབྱོར་འདུག རྒྱ་ནག..."). With `ga_boundary` (default) such a space also ends a sentence.
Text must be tsheg-separated (normalise TNCC-style spaced syllables with
`join_spaced_syllables` first), otherwise every space after ག/ཀ would split.

Pieces without a Tibetan letter (a lone head mark "༄༅། །", a number, a bracketed Latin word)
are not sentences of their own: they are attached to the following sentence (or to the
preceding one at the end of the text), so no text is lost.
"""

from __future__ import annotations

import re

from tibnlp.text.normalize import is_number_shad

SHADS = "\u0f0d\u0f0e\u0f0f\u0f10\u0f11\u0f12\u0f14"
# Closing quotes and brackets written right after the shad belong to the sentence they close.
_CLOSERS = "\u201d\u2019\u00bb\u300d\u300f\u0f3b\u0f3d)\\]\"'"
_END_RE = re.compile(f"[{SHADS}](?: ?[{SHADS}])*[{_CLOSERS}]*")
_GA_SPACE_RE = re.compile("(?<=[\u0f40\u0f42]) (?=[\u0f40-\u0f6c])")
_LETTER_RE = re.compile("[\u0f40-\u0fbc]")


def _spans(text: str, ga_boundary: bool) -> list[tuple[int, int]]:
    """(start, end) of every non-blank piece between sentence boundaries, spaces trimmed."""
    cuts = [m.end() for m in _END_RE.finditer(text) if not is_number_shad(text, *m.span())]
    if ga_boundary:
        cuts += [m.start() for m in _GA_SPACE_RE.finditer(text)]
    spans = []
    start = 0
    for end in [*sorted(cuts), len(text)]:
        piece = text[start:end]
        left = len(piece) - len(piece.lstrip())
        right = len(piece.rstrip())
        if right > left:
            spans.append((start + left, start + right))
        start = end
    return spans


def split_sentences(text: str, ga_boundary: bool = True) -> list[str]:
    """The sentences of one normalised line, in order, each keeping its closing shad."""
    merged: list[list[int]] = []  # [start, end] of each sentence
    pending: int | None = None  # start of letter-less pieces waiting for the next sentence
    for start, end in _spans(text, ga_boundary):
        if _LETTER_RE.search(text, start, end) is None:
            pending = start if pending is None else pending
            continue
        merged.append([start if pending is None else pending, end])
        pending = None
    if pending is not None:
        if merged:
            merged[-1][1] = len(text.rstrip())
        else:
            merged.append([pending, len(text.rstrip())])
    return [text[a:b] for a, b in merged]
