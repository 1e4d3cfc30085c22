"""Sentence splitting on shad and the line filters."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tibnlp.text import syllables
from tibnlp.text.filtering import choose_heldout, count_syllables, dedup_mask, line_drop_reason
from tibnlp.text.normalize import normalize
from tibnlp.text.sentences import split_sentences


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("བཀྲ་ཤིས། བདེ་ལེགས།", ["བཀྲ་ཤིས།", "བདེ་ལེགས།"]),
        ("ཕྱག་འཚལ་ལོ། །བདག་ནི་སྟོན་པ། །", ["ཕྱག་འཚལ་ལོ། །", "བདག་ནི་སྟོན་པ། །"]),  # double shad
        ("ཀ་ཁ༎ ག་ང", ["ཀ་ཁ༎", "ག་ང"]),  # U+0F0E nyis shad
        ("ཀ་ཁ༏ ག་ང༑ ཅ་ཆ༔ ཇ་ཉ", ["ཀ་ཁ༏", "ག་ང༑", "ཅ་ཆ༔", "ཇ་ཉ"]),  # variants
        ("ཀ་ཁ༐ ག་ང༒ ཅ་ཆ", ["ཀ་ཁ༐", "ག་ང༒", "ཅ་ཆ"]),
        ("ཀ་ཁ་ག", ["ཀ་ཁ་ག"]),  # no shad: the line is one sentence
        ("ཁྱིམ་དུ་འབྱོར་འདུག རྒྱ་ནག་གཞུང་།", ["ཁྱིམ་དུ་འབྱོར་འདུག", "རྒྱ་ནག་གཞུང་།"]),  # ga
        ("༄༅། །འདུལ་བ་བཞུགས་སོ། །", ["༄༅། །འདུལ་བ་བཞུགས་སོ། །"]),  # head mark attached
        ("དེ་ནས། ༢༠༡༢", ["དེ་ནས། ༢༠༡༢"]),  # trailing letter-less piece goes back
        ("“ཀ་ཁ།” ཅེས་བརྗོད།", ["“ཀ་ཁ།”", "ཅེས་བརྗོད།"]),  # closing quote stays
        ("", []),
    ],
)
def test_split(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected


def test_ga_boundary_can_be_disabled() -> None:
    text = "འབྱོར་འདུག རྒྱ་ནག"
    assert split_sentences(text, ga_boundary=False) == [text]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([*"ཀཁགངབམ", "་", "།", "༎", " ", "༄", "a", "༢"]), max_size=60))
def test_split_loses_no_text(chars: list[str]) -> None:
    text = normalize("".join(chars))
    sentences = split_sentences(text)
    assert " ".join(sentences).replace(" ", "") == text.replace(" ", "")
    assert all(s in text for s in sentences)
    assert all(s == s.strip() and s for s in sentences)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("", "empty"),
        ("Dalai Lama said", "too_little_tibetan"),
        ("༢༠༡༢ ༡༢", "too_little_tibetan"),  # digits only: no Tibetan letter
        ("ཀ་ཁ The quick brown fox jumps", "too_little_tibetan"),
        ("བཀྲ།", "too_few_syllables"),
        ("བཀྲ་ཤིས (Tashi)", None),
        ("བཀྲ་ཤིས་བདེ་ལེགས།", None),
    ],
)
def test_line_filter(line: str, reason: str | None) -> None:
    assert line_drop_reason(line, min_tibetan_ratio=0.5, min_syllables=2) == reason


def test_dedup_keeps_first_and_short_sentences() -> None:
    seen: set[int] = set()
    assert dedup_mask([1, 2, 1], seen, 3, [5, 5, 5]) == [True, True, False]
    assert dedup_mask([2, 7, 7], seen, 3, [5, 2, 2]) == [False, True, True]  # 7 is short


def test_heldout_is_by_source_and_deterministic() -> None:
    docs = {i: ("a" if i < 300 else "b") for i in range(400)}
    chosen = choose_heldout(docs, 0.05, seed=1)
    assert chosen == choose_heldout(docs, 0.05, seed=1)
    assert chosen != choose_heldout(docs, 0.05, seed=2)
    assert sum(docs[i] == "a" for i in chosen) == 15
    assert sum(docs[i] == "b" for i in chosen) == 5
    assert len(choose_heldout({0: "a", 1: "a"}, 0.01, seed=1)) == 1  # never empty by rounding
    assert choose_heldout(docs, 0.0, seed=1) == set()


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=[*"ཀཁགངབམ", "་", "།", " ", "༢", "ཱ", "ྲ", "a"], max_size=40))
def test_fast_syllable_count_agrees(text: str) -> None:
    assert count_syllables(text) == syllables.count_syllables(text)
    line = normalize(text)
    assert count_syllables(line) == sum(count_syllables(s) for s in split_sentences(line))


# The tibettimes news corpus writes times, decimals and dates with a shad between Tibetan
# digits (1,085 times in its first 20,000 lines): ༡༠།༠༠ (10:00), ༢།༦ (2.6), ༢༠༡༦།༠༧།༢༦.
NUMBERS = [
    ("ཆུ་ཚོད་ ༡༠།༠༠ བའི་སྟེང་། བོད་ཀྱི་མི་མང་འཛོམས།", 2),
    ("ཨ་སྒོར་ཐེར་འབུམ་ ༢།༦ ལྷག་གི་རོགས་རམ་གནང་།", 1),
    ("༢༠༡༦།༠༧།༢༦ ཉིན་རྒྱ་གར་ནས།", 1),
]


@pytest.mark.parametrize(("text", "n_sentences"), NUMBERS)
def test_a_shad_between_digits_is_part_of_the_number(text: str, n_sentences: int) -> None:
    assert normalize(text) == text  # no space pushed into the number
    sentences = split_sentences(normalize(text))
    assert len(sentences) == n_sentences, sentences  # not cut inside the number
    assert "".join(sentences).replace(" ", "") == text.replace(" ", "")


def test_a_closing_shad_before_a_digit_still_gets_its_space() -> None:
    assert normalize("ལ།༢་པ") == "ལ། ༢་པ"
    assert split_sentences("ལོ་ ༢༠༡༥། ༢༠༡༦ ལོར་ཕེབས།") == ["ལོ་ ༢༠༡༥།", "༢༠༡༦ ལོར་ཕེབས།"]
