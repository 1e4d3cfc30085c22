"""Publishing output folders whole: readers see the old folder or the complete new one."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


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
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)
    try:
        yield tmp
        if final.exists() and not replace:
            final.rmdir()  # only an empty folder is silently replaced
        if final.exists():
            old = final.with_name(f".{final.name}.old-{os.getpid()}")
            final.rename(old)
            os.replace(tmp, final)
            shutil.rmtree(old)
        else:
            os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
