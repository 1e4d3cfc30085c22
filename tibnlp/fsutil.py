"""Publishing outputs whole: readers see the old file or folder, or the complete new one.

`atomic_file` (any writer: text, safetensors, a figure) and `atomic_write_text` for files,
`staged_dir` for folders. Every stage writes through these, never a copy of them."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path


def _umask() -> int:
    """The process's umask (reading it means setting it, then putting it back)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


@contextmanager
def staged_dir(final: Path, replace: bool = False) -> Iterator[Path]:
    """A temporary folder beside `final`, renamed to `final` only if the block succeeds.

    An existing `final` is replaced when it is empty, or always with `replace=True` (moved
    aside first, removed after the rename, so `final` is missing only between two renames); on
    any error the temporary folder is removed, so no half-written output is ever left behind.
    The folder gets the permissions a plain mkdir would (mkdtemp makes it private), since
    corpora, vocabularies and models are meant to be shared.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    tmp.chmod(0o777 & ~_umask())
    try:
        yield tmp
        if final.exists() and not replace:
            final.rmdir()  # only an empty folder is silently replaced
        if final.exists():
            old = final.with_name(f".{final.name}.old-{os.getpid()}")
            final.rename(old)
            os.replace(tmp, final)
            if old.is_symlink():  # a link to a folder: drop the link, never its target
                old.unlink()
            else:
                shutil.rmtree(old)
        else:
            os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def atomic_file(final: Path, suffix: str = ".tmp") -> Iterator[Path]:
    """A temporary path beside `final` to write to, renamed to `final` only if the block
    succeeds; on any error it is removed and `final` keeps its old content (or stays absent).
    `suffix` keeps the extension writers that choose the format by name look at (".png")."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=suffix, dir=final.parent)
    os.close(fd)
    tmp = Path(name)
    tmp.chmod(0o666 & ~_umask())  # mkstemp makes it private: give it a plain open()'s mode
    try:
        yield tmp
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: Path, text: str | Iterable[str]) -> None:
    """Write a UTF-8 file (a string, or lines given one by one) so readers see either the
    old or the whole new content, never half."""
    with atomic_file(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        if isinstance(text, str):
            fh.write(text)
        else:
            fh.writelines(text)
