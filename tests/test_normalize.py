"""Normalisation: each rule, idempotence (property-based) and equivalence of spellings."""

from __future__ import annotations

import json
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tibnlp.text.normalize import _INVISIBLE, join_spaced_syllables, normalize

TSHEG, SHAD = "\u0f0b", "\u0f0d"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("བཀྲ\u0f0cཤིས", "བཀྲ་ཤིས"),  # non-breaking tsheg
        ("བཀྲ\u200b་ཤིས\ufeff", "བཀྲ་ཤིས"),  # zero-width space, BOM
        ("\x00བཀྲ་\x07ཤིས\u00ad", "བཀྲ་ཤིས"),  # controls, soft hyphen
        ("  བཀྲ་ཤིས\t\u00a0བདེ་ལེགས།\n", "བཀྲ་ཤིས བདེ་ལེགས།"),  # whitespace runs, strip
        ("བཀྲ ་ཤིས", "བཀྲ་ཤིས"),  # no space before tsheg
        ("བཀྲ་ ཤིས", "བཀྲ་ཤིས"),  # no space between tsheg and next syllable
        ("བཀྲ་་ཤིས", "བཀྲ་ཤིས"),  # repeated tsheg
        ("བདེ་ལེགས །", "བདེ་ལེགས།"),  # no space before closing shad
        ("ལ།དེ་ནི", "ལ། དེ་ནི"),  # closing shad followed by one space
        ("ལོ།   །བདག", "ལོ། །བདག"),  # double shad keeps exactly one space inside
        ("ལོ། །བདག", "ལོ། །བདག"),  # classical form unchanged
        ("ང་།", "ང་།"),  # tsheg before shad after ང is kept
        ("ལོའི་ ༢༠༡༢ ལོ", "ལོའི་ ༢༠༡༢ ལོ"),  # space before digits is kept
        ("(Dalai Lama) ལ", "(Dalai Lama) ལ"),  # Latin untouched
        ("\u0f43", "\u0f42\u0fb7"),  # NFC decomposes the excluded precomposed letter
        ("\u0f73", "\u0f71\u0f72"),
        ("ར\u0f77", "ར\u0fb2\u0f71\u0f80"),  # vocalic rr: its compatibility spelling, NFC
        ("ལ\u0f79", "ལ\u0fb3\u0f71\u0f80"),  # vocalic ll, likewise
        ("ར\u0fb2\u0f81", "ར\u0fb2\u0f71\u0f80"),
        ("\u0f00་མ་ཎི", "\u0f00་མ་ཎི"),  # om has no decomposition: kept
        ("", ""),
    ],
)
def test_rules(raw: str, expected: str) -> None:
    assert normalize(raw) == expected


def test_spaced_syllables_only_joined_when_asked() -> None:
    assert normalize("བྲག ཡེར པ") == "བྲག ཡེར པ"
    assert normalize("བྲག ཡེར པ", join_spaced_syllables=True) == "བྲག་ཡེར་པ"
    assert join_spaced_syllables("བྲག ཡེར པ") == "བྲག་ཡེར་པ"
    # Spaces next to shad or non-Tibetan text stay spaces.
    assert normalize("ཀ ཁ། ག abc ང", join_spaced_syllables=True) == "ཀ་ཁ། ག abc ང"


def test_invisible_list_matches_unicode_categories() -> None:
    chars = []
    for part in _INVISIBLE.split("-"):
        chars += [part[0], part[-1]]
    for ch in chars:
        assert unicodedata.category(ch) in ("Cc", "Cf"), hex(ord(ch))
        assert not ch.isspace()


TIBETAN = st.sampled_from(
    list("ཀཁགངཅཆཇཉཏཐདནཔཕབམཙཚཛཝཞཟའཡརལཤསཧཨ")
    + list("ཱིེོུྲྱླྐྒྷ")
    + ["\u0f43", "\u0f73", "\u0f75", "\u0f81"]  # letters/vowels that NFC decomposes
    + ["\u0f77", "\u0f79", "\u0f80", "\u0fb2", "\u0fb3", "\u0f00"]  # rule 4's vocalic rr/ll
    + list("༠༡༢༣༄༅")
    + [TSHEG, "\u0f0c", SHAD, "\u0f0e", "\u0f11", "\u0f14", "༼", "༽", "”"]
    + [" ", "  ", "\t", "\n", "\u00a0", "\u200b", "\ufeff", "\x00"]
    + ["a", "B", "1", "(", ")", "\u0301", "e\u0301", "\u00e9"]
)
tibetan_text = st.lists(TIBETAN, max_size=40).map("".join)


@settings(max_examples=400, deadline=None)
@given(tibetan_text, st.booleans())
def test_idempotent(text: str, join: bool) -> None:
    once = normalize(text, join)
    assert normalize(once, join) == once
    assert unicodedata.is_normalized("NFC", once)
    assert once == once.strip() and "  " not in once and "\u0f0c" not in once
    assert "\u0f77" not in once and "\u0f79" not in once


@settings(max_examples=200, deadline=None)
@given(tibetan_text)
def test_join_is_idempotent_and_stable(text: str) -> None:
    joined = normalize(text, join_spaced_syllables=True)
    assert join_spaced_syllables(joined) == joined


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([*"ཀཁགངབམརལསའ", "ྲ", "ྱ", "ི", "ུ", "ེ", "ོ"]), min_size=1))
def test_spellings_meet(letters: list[str]) -> None:
    """NFC/NFD, U+0F0C/U+0F0B, zero-width characters, spaced/tsheg forms normalise alike."""
    syllables = ["".join(letters[i : i + 3]) for i in range(0, len(letters), 3)]
    canonical = normalize(TSHEG.join(syllables) + SHAD)
    variants = [
        unicodedata.normalize("NFD", TSHEG.join(syllables) + SHAD),
        "\u0f0c".join(syllables) + SHAD,
        "\u200b".join(s + TSHEG for s in syllables)[:-1] + " " + SHAD,
    ]
    for variant in variants:
        assert normalize(variant) == canonical
    spaced = " ".join(syllables) + SHAD
    if all(unicodedata.category(s[0]) == "Lo" for s in syllables):  # a syllable starts a base
        assert normalize(spaced, join_spaced_syllables=True) == canonical


VOCALIC = {  # U+0F77, U+0F79 and their other spellings (compatibility, then canonical)
    "\u0f77": ["\u0fb2\u0f81", "\u0fb2\u0f71\u0f80"],
    "\u0f79": ["\u0fb3\u0f81", "\u0fb3\u0f71\u0f80"],
}


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from([*VOCALIC, *"ཀརལ", "ི", "ུ", "ཾ", "ྃ", TSHEG]), min_size=1),
    st.sampled_from([0, 1]),
)
def test_vocalic_rr_ll_spellings_meet(parts: list[str], spelling: int) -> None:
    """Text with U+0F77/U+0F79 and the same text with either other spelling normalise alike
    (NFC alone leaves U+0F77/U+0F79 apart), also next to marks that NFC reorders."""
    written = "".join(parts)
    other = "".join(VOCALIC[p][spelling] if p in VOCALIC else p for p in parts)
    assert normalize(written) == normalize(other)


def test_tncc_spaced_titles_match_the_tsheg_form(require_data) -> None:
    """On the real TNCC titles, joining spaced syllables gives the tsheg variant.

    The dataset's `text_tsheg` replaced *every* space, also one before a bracket ("སོ་༽");
    `join_spaced_syllables` leaves spaces next to brackets and shad, so such titles differ.
    """
    path = require_data("tncc/tncc_title_train.jsonl")
    mismatches = total = 0
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            record = json.loads(line)
            if any(b in record["text"] for b in "༺༻༼༽\u0f0d\u0f0e\u0f0f\u0f10\u0f11\u0f12\u0f14"):
                continue
            total += 1
            joined = normalize(record["text"], join_spaced_syllables=True)
            mismatches += joined != normalize(record["text_tsheg"])
    assert total > 1000
    assert mismatches == 0, f"{mismatches} of {total} titles differ"
