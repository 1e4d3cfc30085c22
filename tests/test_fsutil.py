"""staged_dir: outputs appear whole or not at all, with shareable permissions."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tibnlp.fsutil import atomic_file, atomic_write_text, staged_dir


def test_published_whole_with_plain_mkdir_permissions(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        with staged_dir(tmp_path / "out") as tmp:
            (tmp / "a.txt").write_text("a")
    finally:
        os.umask(old)
    out = tmp_path / "out"
    assert (out / "a.txt").read_text() == "a"
    assert stat.S_IMODE(out.stat().st_mode) == 0o755  # not mkdtemp's private 0o700
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_error_leaves_old_output_untouched_and_no_temp(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("old")
    with pytest.raises(RuntimeError), staged_dir(out, replace=True) as tmp:
        (tmp / "half.txt").write_text("half")
        raise RuntimeError("stage failed")
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_replace_swaps_and_non_empty_output_is_refused_without_it(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("old")
    with pytest.raises(OSError), staged_dir(out) as tmp:
        (tmp / "new.txt").write_text("new")
    assert (out / "keep.txt").exists()
    with staged_dir(out, replace=True) as tmp:
        (tmp / "new.txt").write_text("new")
    assert [p.name for p in out.iterdir()] == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_atomic_file_replaces_whole_or_keeps_the_old(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "f.txt"
    atomic_write_text(path, "old")
    with pytest.raises(RuntimeError), atomic_file(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")
    assert path.read_text() == "old" and [p.name for p in path.parent.iterdir()] == ["f.txt"]
    atomic_write_text(path, (f"{i}\n" for i in range(3)))  # lines, as `predict` streams them
    assert path.read_text() == "0\n1\n2\n"
    with atomic_file(tmp_path / "fig.png", suffix=".png") as tmp:
        assert tmp.suffix == ".png"  # writers that pick the format by extension
        tmp.write_bytes(b"png")
    assert (tmp_path / "fig.png").read_bytes() == b"png"
