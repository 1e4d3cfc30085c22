"""A file without Tibetan letters is refused with what it holds: empty, transliterated
(Wylie), or other text shown by its first line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tibnlp.config.text import CorpusConfig
from tibnlp.errors import DataError
from tibnlp.text.prepare import prepare_corpus

TEXT = "བཀྲ་ཤིས་བདེ་ལེགས། ཁྱེད་རང་སྐུ་གཟུགས་བདེ་པོ་ཡིན་པས།\n"


def _refusal(tmp_path: Path, name: str, body: str) -> DataError:
    good = tmp_path / "good.txt"
    good.write_text(TEXT, encoding="utf-8")
    other = tmp_path / name
    other.write_text(body, encoding="utf-8")
    cfg = CorpusConfig(num_proc=1, heldout_fraction=0.0)
    with pytest.raises(DataError) as err:
        prepare_corpus([good, other], tmp_path / "out", cfg, progress=False)
    assert not (tmp_path / "out").exists()
    assert f"{name}: no Tibetan text" in err.value.message
    return err.value


@pytest.mark.parametrize("body", ["", "\n\n  \n"])
def test_an_empty_file_is_said_to_be_empty(tmp_path: Path, body: str) -> None:
    # before: "check the file (and --field for JSONL)" for a file with nothing in it
    assert "empty or blank" in _refusal(tmp_path, "empty.txt", body).hint


def test_wylie_is_named_as_transliteration(tmp_path: Path) -> None:
    hint = _refusal(tmp_path, "wylie.txt", "bkra shis bde legs/ khyed rang sku gzugs\n").hint
    assert "Wylie" in hint and "'bkra shis bde legs/" in hint


def test_other_text_is_shown_by_its_first_line(tmp_path: Path) -> None:
    hint = _refusal(tmp_path, "zh.txt", "\n西藏新闻标题\n第二行\n").hint
    assert "'西藏新闻标题'" in hint and "Wylie" not in hint
