"""botok pickles its trie in place: a first build cut short (Ctrl-C, a killed job) left a
truncated `general_trie.pickled` in the cache, and every later `WordSegmenter` failed with
`EOFError: Ran out of input` until someone found and deleted the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tibnlp.text.words import WordSegmenter


def _pack(path: Path) -> Path:
    """A tiny dialect pack botok reads: one word, no adjustments."""
    (path / "dictionary" / "words").mkdir(parents=True)
    (path / "adjustments").mkdir()
    (path / "dictionary" / "words" / "w.tsv").write_text("བོད\n", "utf-8")
    return path


def _tries(cache: Path) -> list[Path]:
    return list((cache / "botok").glob("*/general_trie.pickled"))


def test_a_build_stopped_part_way_leaves_no_trie(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("botok")
    import botok.tries.trie as botok_trie

    pack, cache = _pack(tmp_path / "pack" / "general"), tmp_path / "cache"

    def dump_then_stop(obj: object, f, protocol: int) -> None:
        f.write(b"\x80\x05partial")  # a pickle's first bytes, then the user's Ctrl-C
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(botok_trie.pickle, "dump", dump_then_stop)
        with pytest.raises(KeyboardInterrupt):
            WordSegmenter(pack, cache)
    assert _tries(cache) == []  # nothing the next run would load
    assert list((cache / "botok").glob("*/.build.*")) == []
    assert WordSegmenter(pack, cache).starts("བོད་ཀྱི་") == [0, 12]
    assert len(_tries(cache)) == 1


def test_a_damaged_trie_is_built_again(tmp_path: Path, capsys) -> None:
    pytest.importorskip("botok")
    pack, cache = _pack(tmp_path / "pack" / "general"), tmp_path / "cache"
    WordSegmenter(pack, cache)
    (trie,) = _tries(cache)
    trie.write_bytes(trie.read_bytes()[:100])  # as a build cut short in place left it
    assert WordSegmenter(pack, cache).starts("བོད་ཀྱི་") == [0, 12]
    said = capsys.readouterr().err
    assert f"{trie} is damaged" in said and "building it again" in said
    WordSegmenter(pack, cache)  # the trie built again loads as it is
    assert "damaged" not in capsys.readouterr().err
