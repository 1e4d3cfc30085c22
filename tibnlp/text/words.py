"""Tibetan words from botok, the field's dictionary-based word segmenter, run offline.

Tibetan writes no spaces between words (the tsheg closes every syllable), so words come from
botok (PyPI `botok`, Esukhia/OpenPecha) with its "general" dialect pack from the data
directory: `$TIBNLP_DATA/botok/general` (manifest `corpora/botok.yaml`; `tibnlp data link`
links it). botok would download a missing pack from GitHub; tibnlp checks the folder first and
fails naming it instead, so nothing is ever fetched at run time.

botok pickles its trie (~12 MB, built in a few seconds) beside the pack's folder, which may
be a read-only shared copy. We point botok at a writable folder of the cache instead,
`$XDG_CACHE_HOME/tibnlp/botok/<botok version>-<pack digest>/` holding a link to the pack
(botok only reads the pack; the trie is written beside the link), keyed by the pack's content
so an edited pack gets a fresh trie, and by botok's version because botok loads any pickled
trie it finds, unchecked, so an upgraded botok would otherwise reuse the old one; a file lock
makes concurrent first uses build it once. botok writes the pickle in place, so a build cut
short (Ctrl-C, a killed job) would leave a truncated trie that every later run fails to load:
tibnlp has botok build it in a private folder and renames it into place, and a damaged trie
found there (written before this was done) is built again.

Stored form of a sentence's words: the UTF-8 byte offsets at which its botok tokens start (in
the `normalize`d sentence), independent of any vocabulary and directly comparable with the
byte offsets SentencePiece reports for its pieces (`tibnlp.data.words` aligns them). Affixed
particles (འི, ས, ར ...) stay inside their syllable's word (`split_affixes=False`), so a word
is a run of whole syllables.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import pickle
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

from tibnlp.data.datadir import dataset_path
from tibnlp.errors import DataError, TibnlpError
from tibnlp.text.syllables import SYLLABLE_RE

PACK = "botok/general"  # inside the data directory
SPLIT_AFFIXES = False


def cache_root() -> Path:
    """`$XDG_CACHE_HOME/tibnlp` (~/.cache/tibnlp): derived files that can always be rebuilt."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "tibnlp"


def require_pack(path: Path | None = None) -> Path:
    """The botok dialect pack folder, or a DataError naming where it was looked for."""
    given = path is not None
    path = Path(path) if path is not None else dataset_path(PACK)
    if not (path / "dictionary").is_dir():
        hint = (
            "link the shared data with `tibnlp data link SOURCE_DIR` (its botok/ folder), or copy "
            "the folder dialect_packs/general of Esukhia/botok-data there"
        )
        if given:  # --pack: the data directory is not where it was looked for
            packs = _packs_below(path)
            hint = (
                f"{path} holds the dialect pack{'s' * (len(packs) > 1)} "
                f"{', '.join(map(str, packs))}: give "
                f"{'that folder' if len(packs) == 1 else 'one of those folders'}"
                if packs
                else "give the pack's own folder (the one with dictionary/ and adjustments/, "
                "e.g. botok/general of the shared data), or leave --pack out to use "
                f"{dataset_path(PACK)}"
            )
        raise DataError(
            f"botok dialect pack not found: {path} has no dictionary/ folder "
            "(whole-word masking, pretrain.masking=whole_word, needs it; it is never downloaded)",
            hint,
        )
    return path


def _packs_below(path: Path) -> list[Path]:
    """Dialect packs one or two levels below `path` (a pack's parent was given: botok/, or
    botok-data's dialect_packs/ or its root)."""
    try:
        found = [*path.glob("*/dictionary"), *path.glob("*/*/dictionary")]
    except OSError:
        return []
    return sorted(p.parent for p in found if p.is_dir())


def pack_digest(path: Path) -> str:
    """sha256 over the pack's files (relative path and content), in path order."""
    h = hashlib.sha256()
    for file in sorted(p for p in Path(path).rglob("*") if p.is_file()):
        if file.name.endswith(".pickled"):
            continue
        h.update(file.relative_to(path).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(file.read_bytes()).digest())
    return h.hexdigest()


def botok_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("botok")
    except PackageNotFoundError:
        raise TibnlpError(
            "whole-word masking (pretrain.masking=whole_word) needs the botok package",
            "pip install botok",
        ) from None


def _link_pack(base: Path, pack: Path) -> None:
    """`base/<pack name>` linked to the pack, where botok looks for it."""
    link = base / pack.name
    if not link.is_dir():  # absent, or left dangling by a copy of the pack that is gone
        # (botok would download a pack it cannot find); an atomic swap, so concurrent
        # first uses all end with a working link
        temp = base / f".{pack.name}.{os.getpid()}"
        temp.unlink(missing_ok=True)
        temp.symlink_to(pack, target_is_directory=True)
        os.replace(temp, link)


def _build_trie(botok: Any, base: Path, pack: Path, trie: Path) -> None:
    """botok's trie built in a private folder beside `trie` and renamed to it: botok writes
    it in place, and a build stopped part way must leave no truncated file behind."""
    work = base / f".build.{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    try:
        work.mkdir()
        _link_pack(work, pack)
        botok.WordTokenizer(config=botok.Config(dialect_name=pack.name, base_path=work))
        if (work / trie.name).exists():  # (else botok named it otherwise: built in place)
            os.replace(work / trie.name, trie)
    finally:
        shutil.rmtree(work, ignore_errors=True)


class WordSegmenter:
    """botok's word tokenizer on the local pack; `starts(text)` gives the stored form."""

    def __init__(self, pack: Path | None = None, cache: Path | None = None) -> None:
        version = botok_version()
        import botok

        pack = require_pack(pack).resolve()
        self.pack = pack
        self.digest = pack_digest(pack)
        base = (cache or cache_root()) / "botok" / f"{version}-{self.digest[:16]}"
        base.mkdir(parents=True, exist_ok=True)
        _link_pack(base, pack)
        # botok warns on every string with a rare stacked letter; the text is still segmented
        warnings.filterwarnings("ignore", module=r"botok(\.|$)")
        with open(base / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one process builds the trie, the rest load it
            config = botok.Config(dialect_name=pack.name, base_path=base)
            trie = base / f"{pack.name}_trie.pickled"  # botok's name: <dialect>_trie.pickled
            if not trie.exists():
                _build_trie(botok, base, pack, trie)
            try:
                self._tokenizer: Any = botok.WordTokenizer(config=config)
            except (EOFError, pickle.UnpicklingError) as exc:  # a trie cut short in place
                print(f"botok's trie {trie} is damaged ({exc}); building it again", file=sys.stderr)
                trie.unlink()
                _build_trie(botok, base, pack, trie)
                self._tokenizer = botok.WordTokenizer(config=config)

    def starts(self, text: str) -> list[int]:
        """UTF-8 byte offsets where the botok tokens of `text` start (text as given)."""
        return self.segment(text)[0]

    def segment(self, text: str) -> tuple[list[int], int]:
        """(`starts(text)`, how many of those tokens hold a syllable: the words proper)."""
        out: list[int] = []
        byte = char = words = 0
        for token in self._tokenizer.tokenize(text, split_affixes=SPLIT_AFFIXES):
            byte += len(text[char : token.start].encode())
            char = token.start
            out.append(byte)
            words += SYLLABLE_RE.search(token.text) is not None
        return out, words
