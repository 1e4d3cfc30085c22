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

    An existing `final` is replaced when it is empty, or always with `replace=True`; on any
    error the temporary folder is removed, so no half-written output is ever left behind.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        yield tmp
        if final.exists():
            if replace:
                shutil.rmtree(final)
            else:
                final.rmdir()
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
