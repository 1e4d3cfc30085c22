"""Tibetan text normalisation: one canonical spelling for every stage.

Corpus preparation, the vocabulary, fine-tuning and prediction all call `normalize`, so the
same text typed differently (NFC or not, U+0F0C or U+0F0B, zero-width characters, stray
spaces, syllables separated by spaces as TNCC titles are stored) maps to one string and thus
to the same tokens. `normalize` works on one line or segment: newlines become spaces.

The rules, applied in this order (the result is a fixed point: `normalize(normalize(x)) ==
normalize(x)`, checked by property tests):

1. Control characters (Unicode Cc) and format characters (Cf: zero-width space/joiners, BOM,
   soft hyphen, bidi marks) are removed; whitespace controls (tab, newline, ...) count as
   whitespace.
2. The non-breaking tsheg U+0F0C becomes the tsheg U+0F0B (they differ only in line breaking).
3. Every run of whitespace (any Unicode space, NBSP included) becomes one ASCII space; leading
   and trailing spaces are removed.
4. Unicode NFC. (For Tibetan NFC *decomposes* the precomposed letters and vowels that are
   composition exclusions, e.g. U+0F43 -> U+0F42 U+0FB7 and U+0F73 -> U+0F71 U+0F72, so both
   spellings meet.) Before it, the vowel signs U+0F77 (vocalic rr) and U+0F79 (vocalic ll),
   which NFC leaves alone (their decompositions are compatibility ones; Unicode discourages
   their use), become U+0FB2 U+0F81 and U+0FB3 U+0F81, which NFC then takes on to U+0FB2
   U+0F71 U+0F80 and U+0FB3 U+0F71 U+0F80 (their other spelling), ordering the marks with
   their neighbours'; NFC never composes them back, so the result stays a fixed point.
   U+0F00 (om) is kept: Unicode gives it no decomposition (NFKC keeps it too), and it is a
   sign of its own, the om ligature written as one letter, not a typing variant of "ཨོཾ".
5. Only when asked (`join_spaced_syllables=True`, config `corpus.join_spaced_syllables`): a
   space between two Tibetan syllable characters becomes a tsheg: "བྲག ཡེར པ" -> "བྲག་ཡེར་པ"
   (the TNCC "text" -> "text_tsheg" rule). Spaces next to shad, brackets or non-Tibetan text
   stay. (Word-segmented text needs `remove_word_spaces` instead: there such a space splits
   a particle off its syllable.)
6. Tsheg spacing: no space before a tsheg, no space between a tsheg and the consonant starting
   the next syllable, and repeated tshegs collapse to one ("ཀ ་ ་ཁ" -> "ཀ་ཁ").
7. Shad spacing (shad = U+0F0D-U+0F12, U+0F14): no space between a syllable and the shad that
   closes it ("ཀ །" -> "ཀ།"); a closing shad run directly followed by a Tibetan letter, digit
   or head mark gets one space after it ("ལ།དེ" -> "ལ། དེ"). The space inside a double shad
   "། །" is kept as one space, so the classical "ལོ། །བདག" (closing shad, space, opening
   shad) is left as it is. One shad between two Tibetan digits separates digit groups (times
   "༡༠།༠༠", decimals "༢།༦", dates "༢༠༡༦།༠༧།༢༦" in news) and gets no space.

Nothing else is changed: no tsheg is added or removed before a shad (the "ང་།" convention),
digits and Latin text are kept.
"""

from __future__ import annotations

import re
import unicodedata

TSHEG = "\u0f0b"
NBSP_TSHEG = "\u0f0c"

# Cc and Cf characters that are not whitespace (generated from Unicode 14 data; the test checks
# each is still Cc/Cf). ZWNJ/ZWJ go too: they carry no meaning in Tibetan.
_INVISIBLE = (
    "\u0000-\u0008\u000e-\u001b\u007f-\u0084\u0086-\u009f\u00ad\u0600-\u0605\u061c\u06dd"
    "\u070f\u0890-\u0891\u08e2\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f"
    "\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U00013438\U0001bca0-\U0001bca3"
    "\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f"
)
_INVISIBLE_RE = re.compile(f"[{_INVISIBLE}]+")
# Rule 4: NFC keeps these (compatibility decompositions only); NFC decomposes U+0F81 further.
_VOCALIC_RR_LL = {"\u0f77": "\u0fb2\u0f81", "\u0f79": "\u0fb3\u0f81"}
_SPACE_RE = re.compile(r"\s+")

_SHAD = "\u0f0d-\u0f12\u0f14"
# What starts a syllable or a token after a space: consonants, digits, head marks.
_START = "\u0f00-\u0f0a\u0f20-\u0f33\u0f40-\u0f6c\u0f88-\u0f8c"
# Tibetan characters that can end a syllable (everything but tsheg/shad/gter tsheg/brackets).
_SYLLABLE_END = "\u0f00-\u0f0a\u0f13\u0f15-\u0f39\u0f3e-\u0fff"

# Patterns start with a literal or a character set where possible: `re` then scans for that
# prefix in C instead of trying every position (several times faster on long lines).
_JOIN_RE = re.compile(f" (?<=[{_SYLLABLE_END}] )(?=[{_START}])")
_WORD_SPACE_RE = re.compile(" (?<=[\u0f40-\u0fbc] )(?=[\u0f40-\u0fbc])")  # letter _ letter
_TSHEG_RUN_RE = re.compile(f"{TSHEG}{TSHEG}+")
_SPACE_AFTER_TSHEG_RE = re.compile(f"{TSHEG} (?=[\u0f40-\u0f6c])")
_SPACE_BEFORE_SHAD_RE = re.compile(f" (?<=[^{_SHAD} ] )(?=[{_SHAD}])")
_SHAD_BEFORE_START_RE = re.compile(f"[{_SHAD}]+(?=[{_START}])")
_SHADS = frozenset("\u0f0d\u0f0e\u0f0f\u0f10\u0f11\u0f12\u0f14 ")
_DIGITS = "".join(chr(c) for c in range(0x0F20, 0x0F34))  # digits and half digits


def _clean(text: str) -> str:
    """Rules 1-4: invisible characters, U+0F0C, whitespace, NFC."""
    if not text.isprintable():  # false for any Cc, Cf or non-ASCII space: the slow path
        text = _SPACE_RE.sub(" ", _INVISIBLE_RE.sub("", text))
    elif "  " in text:
        text = _SPACE_RE.sub(" ", text)
    text = text.replace(NBSP_TSHEG, TSHEG).strip(" ")
    for sign, spelled in _VOCALIC_RR_LL.items():
        if sign in text:  # (rare: a scan in C, no copy, for the rest)
            text = text.replace(sign, spelled)
    return unicodedata.normalize("NFC", text)


def join_spaced_syllables(text: str) -> str:
    """Space-separated syllables (TNCC titles) -> tsheg-separated: "བྲག ཡེར པ" -> "བྲག་ཡེར་པ".

    Only single ASCII spaces between Tibetan syllable characters are replaced; call it on
    `normalize`d text (or use `normalize(text, join_spaced_syllables=True)`).
    """
    return _JOIN_RE.sub(TSHEG, text)


def remove_word_spaces(text: str) -> str:
    """Word-segmented text (words separated by spaces, tsheg kept) -> running text:
    "མི་དམངས་ དྲ་བ འི་" -> "མི་དམངས་དྲ་བའི་".

    The space after a tsheg goes anyway (rule 6); a space between two letters splits an
    affixed particle (འི, ས, ར, འམ...) off its syllable, so it is dropped, not made a tsheg
    as `join_spaced_syllables` would ("བ་འི" would read as two syllables). Spaces next to
    digits, shads or other text stay. Call it on `normalize`d text.
    """
    return _WORD_SPACE_RE.sub("", text)


def _space_closing_shad(match: re.Match[str]) -> str:
    start = match.start()
    if start == 0 or match.string[start - 1] in _SHADS:  # an opening shad: leave it
        return match.group()
    if is_number_shad(match.string, start, match.end()):  # "༡༠།༠༠": inside a number
        return match.group()
    return match.group() + " "


def is_number_shad(text: str, start: int, end: int) -> bool:
    """Is `text[start:end]` one shad with a Tibetan digit right on each side ("༡༠།༠༠")?"""
    return (
        end == start + 1
        and text[start] == "\u0f0d"
        and start > 0
        and end < len(text)
        and text[start - 1] in _DIGITS
        and text[end] in _DIGITS
    )


def _fix_spacing(text: str) -> str:
    """Rules 6-7 on text with single spaces."""
    if TSHEG in text:
        text = text.replace(" " + TSHEG, TSHEG)
        if TSHEG + TSHEG in text:
            text = _TSHEG_RUN_RE.sub(TSHEG, text)
        if TSHEG + " " in text:
            text = _SPACE_AFTER_TSHEG_RE.sub(TSHEG, text)
    text = _SPACE_BEFORE_SHAD_RE.sub("", text)
    return _SHAD_BEFORE_START_RE.sub(_space_closing_shad, text)


def normalize(text: str, join_spaced_syllables: bool = False) -> str:
    """The canonical form of one line of Tibetan text (rules in the module docstring)."""
    text = _clean(text)
    if join_spaced_syllables:
        text = _JOIN_RE.sub(TSHEG, text)
    return _fix_spacing(text)


_CLOSING_MARKS_RE = re.compile(f"[{_SHAD}{TSHEG} ]+$")


def strip_closing_marks(text: str) -> str:
    """Drop the shads, tshegs and spaces that end a text: "བཀྲ་ཤིས་བདེ་ལེགས།" -> "བཀྲ་ཤིས་བདེ་ལེགས".

    For classifiers of short texts: whether a title or message ends with a shad (or the
    "ང་།" tsheg before it) is how it was typed, not what it says. Corpus preparation and the
    vocabulary keep the marks; call it on `normalize`d text.
    """
    return _CLOSING_MARKS_RE.sub("", text)
