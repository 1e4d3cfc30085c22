"""Where datasets live: `$TIBNLP_DATA`, else `$XDG_CACHE_HOME/tibnlp/data` (~/.cache/...).

Layout: one folder per dataset (`tncc/`, `tusa/`, ...) plus `corpora/` for raw text, so a
folder of symlinks to an existing copy works as a data directory (`tibnlp data link`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from tibnlp.errors import DataError
from tibnlp.fsutil import blocking_file, make_dirs, staged_dir

ENV_VAR = "TIBNLP_DATA"


def data_dir() -> Path:
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "tibnlp" / "data"


def dataset_path(relative: str) -> Path:
    """Absolute path of a file or folder inside the data directory (may not exist)."""
    return data_dir() / relative


def require(relative: str, what: str = "") -> Path:
    """Like `dataset_path`, but a clear error naming the data directory when it is absent."""
    path = dataset_path(relative)
    if not path.exists():
        raise DataError(
            f"{what or relative} not found: {path} does not exist",
            f"put the files under {data_dir()} (set ${ENV_VAR} to use another folder), "
            "or link an existing copy with `tibnlp data link SOURCE_DIR`",
        )
    return path


def check_data_dir(root: Path) -> None:
    """A DataError naming the file or broken link that makes `root` unusable as the data
    directory (`root` itself, or a part of its path), or the folder it cannot read; nothing
    when it is a readable folder or absent."""
    try:
        blocker = blocking_file(root)
        if blocker is None:
            if root.is_dir():
                with os.scandir(root) as entries:
                    next(entries, None)
            return
    except OSError as exc:
        raise DataError(
            f"the data directory {root} cannot be read: {exc.filename or root}: "
            f"{exc.strerror or exc}",
            f"make it readable, or point ${ENV_VAR} at a folder you can read",
        ) from exc
    if blocker.is_symlink() and not blocker.exists():
        what = f"{blocker} is a broken link to {os.readlink(blocker)}"
        hint = f"restore {os.readlink(blocker)}, remove the link, or point ${ENV_VAR} at a folder"
    else:
        what = f"{blocker} is a file, not a folder"
        hint = f"point ${ENV_VAR} at a folder, or move the file {blocker} away"
    if blocker == root:
        raise DataError(f"the data directory {what}", hint)
    raise DataError(f"the data directory {root} cannot be read: {what}", hint)


class LinkResult(NamedTuple):
    linked: list[str]  # folders linked now
    kept: dict[str, str]  # entries that were there already, left alone: name -> what it is


def link_into(
    source: Path, names: set[str] | None = None, target: Path | None = None
) -> LinkResult:
    """Symlink every dataset folder (and `corpora/`) of `source` into the data directory.

    `source` has the data directory's layout, or holds it under `data/` (datasets) and
    `corpora/`. Only folders in `names` (when given) are linked; existing entries are left
    alone, and returned with what they are ("already linked", "links to X", "not a link"), so
    the caller can say why a folder was not linked (e.g. it points at an older copy); a
    broken link (its copy moved or deleted) is replaced.
    """
    source = Path(source).expanduser().resolve()
    target = target or data_dir()
    if not source.exists():
        raise DataError(f"{source} does not exist", "give the folder that holds the datasets")
    if not source.is_dir():
        raise DataError(f"{source} is not a directory", "give the folder that holds the datasets")
    candidates: list[Path] = []
    for folder in (source, source / "data"):
        try:
            if folder.is_dir():
                candidates += [
                    p
                    for p in sorted(folder.iterdir())
                    if p.is_dir() and p.name != "data" and (names is None or p.name in names)
                ]
        except OSError as exc:
            raise DataError(
                f"cannot read {exc.filename or folder}: {exc.strerror or exc}",
                "give a folder you can read, or make it readable",
            ) from exc
    if not candidates:
        hint = "expected folders like tncc/ or corpora/"
        if names is not None and source.name in names:  # the dataset's own folder was given
            hint = f"{source} looks like the '{source.name}' folder itself: give {source.parent}"
        raise DataError(f"{source} holds no dataset folders", hint)
    _make_data_dir(target)
    result = LinkResult([], {})
    for path in candidates:
        dest = target / path.name
        if dest.is_symlink() and not dest.exists():
            dest.unlink()  # a broken link holds nothing: the new copy takes its place
        if dest.is_symlink():
            if dest.resolve() == path.resolve():
                result.kept[path.name] = "already linked"
            else:
                result.kept[path.name] = f"links to {dest.readlink()}"
            continue
        if dest.exists():
            result.kept[path.name] = "not a link"
            continue
        try:
            dest.symlink_to(path, target_is_directory=True)
        except OSError as exc:  # no write permission on the data directory, a read-only disk
            raise DataError(
                f"cannot link {path} as {dest}: {exc.strerror or exc}"
                + (f" (linked before this: {', '.join(result.linked)})" if result.linked else ""),
                f"make {target} writable, or set ${ENV_VAR} to a folder you can write to",
            ) from exc
        result.linked.append(path.name)
    return result


def _make_data_dir(target: Path) -> None:
    """Create the data directory: a file there is a mistake in $TIBNLP_DATA, and said so."""
    try:
        make_dirs(target)
    except DataError as exc:
        raise DataError(
            f"data directory: {exc.message}", f"set ${ENV_VAR} to a folder path"
        ) from exc


def derive(source: Path, out: Path, replaced: dict[str, str]) -> None:
    """Write `out`: a data directory that is `source` with the files in `replaced` (paths
    relative to it, e.g. "tncc/tncc_title_train.jsonl") holding new text. Everything else is
    a symlink into `source`, so `TIBNLP_DATA=out` changes only those files. Staged, so a
    failed run leaves no half-written `out`."""
    if out.exists():
        raise DataError(f"{out} exists", "choose a new output folder")
    folders = {Path(rel).parts[0] for rel in replaced}
    with staged_dir(out) as tmp:
        for entry in source.iterdir():
            if entry.name not in folders:
                os.symlink(entry.resolve(), tmp / entry.name)
        for folder in folders:
            (tmp / folder).mkdir()
            for entry in (source / folder).iterdir():
                if f"{folder}/{entry.name}" not in replaced:
                    os.symlink(entry.resolve(), tmp / folder / entry.name)
        for rel, text in replaced.items():
            (tmp / rel).write_text(text, encoding="utf-8")
