"""The botok trie cache (`tibnlp.text.words.WordSegmenter`) is keyed on the pack's content and
reaches the pack through a link. When the same pack later lives elsewhere (the data directory
re-linked, the old copy gone), the cached link dangles; botok then finds no pack folder and
downloads one from GitHub, which tibnlp promises never to do."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from tibnlp.text.words import WordSegmenter


def _pack(path: Path) -> Path:
    (path / "dictionary").mkdir(parents=True)
    (path / "dictionary" / "words.tsv").write_text("བོད\n", "utf-8")
    return path


def _tokenizer(config: object) -> object:
    """botok's WordTokenizer as far as the cache sees it: it pickles the trie beside the pack
    link (in the private folder of a first build, `words._build_trie`)."""
    (Path(config.base) / "general_trie.pickled").write_bytes(b"")
    return object()


def test_a_moved_pack_is_read_where_it_now_is(tmp_path: Path, monkeypatch) -> None:
    botok = pytest.importorskip("botok")
    seen: list[Path] = []

    def config(dialect_name: str, base_path: Path) -> object:
        # botok's get_dialect_pack: a pack folder that is not a directory is downloaded
        folder = Path(base_path) / dialect_name
        if not folder.is_dir():
            raise AssertionError(f"botok would download the pack: {folder} is not a folder")
        seen.append(folder.resolve())
        return SimpleNamespace(base=base_path)

    monkeypatch.setattr(botok, "Config", config)
    monkeypatch.setattr(botok, "WordTokenizer", _tokenizer)
    cache = tmp_path / "cache"
    old = _pack(tmp_path / "old" / "general")
    WordSegmenter(old, cache)
    new = shutil.copytree(old, tmp_path / "new" / "general")
    shutil.rmtree(old)
    WordSegmenter(new, cache)  # same content, same cache folder
    # the old pack read twice (its trie built in a private folder, then loaded), the new one
    # once (same content: the trie is there)
    assert seen == [old.resolve(), old.resolve(), new.resolve()]


def test_another_botok_version_gets_its_own_trie(tmp_path: Path, monkeypatch) -> None:
    """botok loads any pickled trie it finds: after an upgrade it must not reuse the old one."""
    botok = pytest.importorskip("botok")
    import tibnlp.text.words as words

    bases: list[Path] = []

    def config(dialect_name: str, base_path: Path) -> object:
        if not Path(base_path).name.startswith(".build."):  # (a first build's own folder)
            bases.append(Path(base_path))
        return SimpleNamespace(base=base_path)

    monkeypatch.setattr(botok, "Config", config)
    monkeypatch.setattr(botok, "WordTokenizer", _tokenizer)
    pack = _pack(tmp_path / "pack" / "general")
    for version in ("1.1.7", "1.1.7", "2.0.0"):
        monkeypatch.setattr(words, "botok_version", lambda v=version: v)
        WordSegmenter(pack, tmp_path / "cache")
    assert bases[0] == bases[1] != bases[2]
