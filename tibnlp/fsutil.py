"""Publishing outputs whole: readers see the old file or folder, or the complete new one.

`atomic_file` (any writer: text, safetensors, a figure) and `atomic_write_text` for files,
`staged_dir` for folders. Every stage writes through these, never a copy of them. Their
temporaries are removed on any error; a forced exit, which runs no `finally`, removes them
with `remove_staged` (`tibnlp.stopping`).
An output path that names the wrong kind of thing (a folder where a file goes, a file where a
folder goes, or under a file) is a `DataError` naming it, checked before anything is written:
`check_file_path` and `check_folder_path` let a command refuse it before its work, too."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tibnlp.errors import DataError

_staged: dict[Path, int] = {}  # temporaries being written, by the pid that made each


def remove_staged() -> None:
    """Remove this process's temporaries (best effort): for an exit that runs no `finally`.
    A forked child's copy of its parent's entries is left alone."""
    for tmp, pid in list(_staged.items()):
        if pid == os.getpid():
            if tmp.is_dir() and not tmp.is_symlink():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    tmp.unlink()


def _umask() -> int:
    """The process's umask (reading it means setting it, then putting it back)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def _kind(path: Path) -> str:
    return "a broken link" if path.is_symlink() and not path.exists() else "a file"


def blocking_file(folder: Path) -> Path | None:
    """The nearest existing part of `folder` (itself or an ancestor) when it is not a folder:
    what would make `mkdir -p folder` fail; None when nothing does."""
    for part in (folder, *folder.parents):
        if part.is_dir():
            return None
        if part.exists() or part.is_symlink():
            return part
    return None


def check_folder_path(folder: Path) -> Path:
    """`folder` as given, or a DataError naming the file it is (or lies under): a command can
    refuse it before its work rather than fail with an OS error after it."""
    folder = Path(folder)
    _refuse_blocker(folder, folder, "make folder")
    return folder


def check_file_path(path: Path) -> Path:
    """`path` as given, or a DataError when it is a folder or lies under a file."""
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{path} is a folder; give a file path")
    _refuse_blocker(path.parent, path, "write")
    return path


def _refuse_blocker(folder: Path, target: Path, verb: str) -> None:
    blocker = blocking_file(folder)
    if blocker == target:
        raise DataError(f"{target} is {_kind(target)}; give a folder path")
    if blocker is not None:
        raise DataError(
            f"cannot {verb} {target}: {blocker} is {_kind(blocker)}",
            "give a path whose parents are folders",
        )


def check_new_folder(folder: Path, hint: str = "choose a new --output") -> Path:
    """`folder` as given, or a DataError when it is a file or a folder with files in it: an
    output a command makes whole (vocabularies, exports) never mixes with an earlier one."""
    folder = check_folder_path(folder)
    if folder.is_dir() and any(folder.iterdir()):
        raise DataError(f"{folder} already exists and is not empty", hint)
    return folder


def make_dirs(folder: Path) -> Path:
    """`mkdir -p`, with a DataError naming the file in the way instead of an OS error."""
    with _unwritable(folder):
        check_folder_path(folder).mkdir(parents=True, exist_ok=True)
    return Path(folder)


@contextmanager
def _unwritable(target: Path) -> Iterator[None]:
    """An OS error making `target`'s folder or temporary (no permission, a read-only or full
    disk) as a DataError naming it: a user mistake, not a traceback."""
    try:
        yield
    except OSError as exc:
        raise DataError(
            f"cannot write {target}: {exc.strerror or exc}",
            "choose an output path in a folder you can write to",
        ) from exc


def share(path: Path) -> Path:
    """Give `path` the mode a plain open() would: some writers (safetensors' save_file)
    create their file private (0600), and weights are meant to be shared like the rest."""
    Path(path).chmod(0o666 & ~_umask())
    return Path(path)


@contextmanager
def staged_dir(final: Path, replace: bool = False) -> Iterator[Path]:
    """A temporary folder beside `final`, renamed to `final` only if the block succeeds.

    An existing `final` is replaced when it is empty, or always with `replace=True` (moved
    aside first, removed after the rename, so `final` is missing only between two renames); on
    any error the temporary folder is removed, so no half-written output is ever left behind.
    The folder gets the permissions a plain mkdir would (mkdtemp makes it private), since
    corpora, vocabularies and models are meant to be shared.
    """
    final = check_folder_path(final)
    make_dirs(final.parent)
    with _unwritable(final):
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    _staged[tmp] = os.getpid()
    tmp.chmod(0o777 & ~_umask())
    try:
        yield tmp
        # complete: from here a forced exit leaves it (between the renames below it may be
        # the only copy of the new output), not removes it
        _staged.pop(tmp, None)
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
        _staged.pop(tmp, None)


def walk_files(
    folder: Path,
    skip: Callable[[Path, list[Path]], bool] | None = None,
    unreadable: Callable[[Path, OSError], None] | None = None,
) -> Iterator[Path]:
    """The files under `folder` at any depth, hidden ones (names starting with '.') left out,
    through linked folders: each folder entered once, by its resolved path, so a link back up
    is no endless loop (`Path.rglob` does not follow links). `skip(folder, entries)`: a
    folder below `folder` to leave out; `unreadable(folder, error)`: one that cannot be
    listed (default: left out). The one walk of inputs: the readers' (which skip tibnlp's
    own outputs) and the pipeline input hash's (which covers everything)."""
    seen: set[Path] = set()
    pending = [folder]
    while pending:
        top = pending.pop()
        real = top.resolve()
        if real in seen:
            continue
        seen.add(real)
        try:
            entries = sorted(top.iterdir())
        except OSError as exc:
            if unreadable is not None:
                unreadable(top, exc)
            continue
        if top != folder and skip is not None and skip(top, entries):
            continue
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if entry.is_dir():
                pending.append(entry)
            elif entry.is_file():
                yield entry


def _a_stream(path: Path) -> bool:
    """/dev/stdout, /dev/stderr or /dev/fd/N: a descriptor of this process, not a file."""
    name = str(path.absolute())
    return name in ("/dev/stdout", "/dev/stderr") or name.startswith(("/dev/fd/", "/proc/self/fd/"))


@contextmanager
def atomic_file(final: Path, suffix: str = ".tmp") -> Iterator[Path]:
    """A temporary path beside `final` to write to, renamed to `final` only if the block
    succeeds; on any error it is removed and `final` keeps its old content (or stays absent).
    `suffix` keeps the extension writers that choose the format by name look at (".png").

    A link is followed: the file it names is replaced, not the link. A target that exists
    and is not a file (a FIFO, `-o >(gzip > out.gz)`, /dev/stdout on a terminal) is
    written as it is: there is nothing to rename over it. So are /dev/stdout, /dev/stderr
    and /dev/fd/N (redirected to a file they name it; a rename would drop what `>>` keeps)."""
    final = check_file_path(final)
    if final.exists() and (not final.is_file() or _a_stream(final)):
        yield final
        return
    if final.is_symlink():
        try:
            final = check_file_path(final.resolve(strict=False))
        except (RuntimeError, OSError) as exc:  # a loop of links
            raise DataError(f"cannot write {final}: {exc}", "give a file path") from exc
    make_dirs(final.parent)
    with _unwritable(final):
        fd, name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=suffix, dir=final.parent)
    os.close(fd)
    tmp = Path(name)
    _staged[tmp] = os.getpid()
    share(tmp)  # mkstemp makes it private
    try:
        yield tmp
        share(tmp)  # again: a writer that replaces the file may have made it private anew
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
        _staged.pop(tmp, None)


def atomic_write_text(path: Path, text: str | Iterable[str]) -> None:
    """Write a UTF-8 file (a string, or lines given one by one) so readers see either the
    old or the whole new content, never half."""
    with atomic_file(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        if isinstance(text, str):
            fh.write(text)
        else:
            fh.writelines(text)


_LINE_END = re.compile(r"\r\n|[\r\n]")  # what a JSON string cannot hold raw


def text_lines(text: str) -> list[str]:
    """The lines of a text file's content, ending at LF, CRLF or a lone CR only, not at every
    break `str.splitlines` knows: a JSON string may hold U+2028 or U+0085 raw
    (`json.dumps(ensure_ascii=False)` leaves them), and a form feed or U+2029 inside a text
    line would shift every line number after it."""
    lines = _LINE_END.split(text)
    if lines[-1] == "":  # the newline that ends the last line
        lines.pop()
    return lines
