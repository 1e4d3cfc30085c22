"""staged_dir and atomic_file: outputs appear whole or not at all, with shareable
permissions, and an output path of the wrong kind is refused naming it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tibnlp.errors import DataError
from tibnlp.fsutil import (
    atomic_file,
    atomic_write_text,
    check_file_path,
    check_folder_path,
    make_dirs,
    staged_dir,
)


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


def test_an_output_of_the_wrong_kind_is_a_clear_error(tmp_path: Path) -> None:
    """`predict -o FOLDER`, `runs plot -o FOLDER` raised IsADirectoryError after the work;
    `export hf --output FILE` NotADirectoryError; a file among the parents FileExistsError."""
    folder, file = tmp_path / "folder", tmp_path / "file"
    folder.mkdir()
    file.write_text("keep")
    with pytest.raises(DataError, match=r"folder is a folder; give a file path"):
        atomic_write_text(folder, "x")
    with pytest.raises(DataError, match=r"file is a file; give a folder path"), staged_dir(file):
        pass
    with pytest.raises(DataError, match=r"cannot write .*file/sub/x.txt: .*file is a file"):
        atomic_write_text(file / "sub" / "x.txt", "x")
    with pytest.raises(DataError, match=r"cannot make folder .*file/out: .*file is a file"):
        make_dirs(file / "out")
    with pytest.raises(DataError, match=r"is a broken link; give a folder path"):
        (tmp_path / "dangling").symlink_to(tmp_path / "gone")
        check_folder_path(tmp_path / "dangling")
    assert file.read_text() == "keep" and not any(folder.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "file", "folder"]
    assert check_file_path(tmp_path / "new" / "x.txt") == tmp_path / "new" / "x.txt"


def test_weights_written_by_safetensors_get_a_plain_files_mode(tmp_path: Path) -> None:
    """safetensors' save_file creates its file 0600; published weights are shared files."""
    import torch
    from safetensors.torch import save_file

    old = os.umask(0o022)
    try:
        with atomic_file(tmp_path / "w.safetensors") as tmp:
            save_file({"x": torch.zeros(2)}, str(tmp))
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "w.safetensors").stat().st_mode) == 0o644


def test_an_output_that_cannot_be_made_is_a_data_error_naming_it() -> None:
    # /proc refuses new folders and files even to root, as a read-only disk would
    target = Path("/proc/tibnlp-no-such/out")
    with pytest.raises(DataError, match=r"cannot write /proc/tibnlp-no-such"):
        make_dirs(target)
    with pytest.raises(DataError, match=r"cannot write /proc/tibnlp-no-such"), staged_dir(target):
        pass
    with pytest.raises(DataError, match=r"cannot write /proc/tibnlp-no-such"):
        atomic_write_text(target / "f.txt", "x")
    with pytest.raises(DataError, match=r"cannot write /proc/f.txt"):  # the folder exists
        atomic_write_text(Path("/proc/f.txt"), "x")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_an_output_that_is_a_pipe_is_written_into_not_replaced(tmp_path: Path) -> None:
    """`-o fifo` (or `-o >(gzip > x)`): the rename put a regular file in the FIFO's place,
    the reader got nothing and waited for good."""
    import threading

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text("utf-8")), daemon=True)
    reader.start()
    atomic_write_text(fifo, "line\n")
    reader.join(timeout=30)
    assert got == ["line\n"] and stat.S_ISFIFO(fifo.lstat().st_mode)


def test_an_output_that_is_a_link_updates_the_file_it_names(tmp_path: Path) -> None:
    """The rename replaced the link with a file, and the file it named kept its old text."""
    real = tmp_path / "real.jsonl"
    real.write_text("old\n", "utf-8")
    link = tmp_path / "link.jsonl"
    link.symlink_to(real)
    atomic_write_text(link, "new\n")
    assert link.is_symlink() and real.read_text("utf-8") == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.jsonl", "real.jsonl"]


def test_a_loop_of_links_is_a_clear_error(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.symlink_to(b)
    b.symlink_to(a)
    with pytest.raises(DataError, match="cannot write"):
        atomic_write_text(a, "x")
