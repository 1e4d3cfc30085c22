"""QA of two small areas: the data directory (`tibnlp data list` / `data link`, $TIBNLP_DATA,
the manifests' status of a copy) and the long-document readings' settings."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.test_long_documents import _cfg, env  # noqa: F401
from tibnlp.cli.main import app
from tibnlp.data.manifests import all_manifests, get_manifest
from tibnlp.errors import DataError


def _data(args: list[str], data: Path) -> tuple[int, str, BaseException | None]:
    res = CliRunner().invoke(app, ["data", *args], env={"TIBNLP_DATA": str(data), "COLUMNS": "400"})
    return res.exit_code, " ".join(res.output.split()), res.exception


def _copy_of(name: str, data: Path) -> Path:
    """The files of dataset `name` written under `data` with the published checksums' names
    (their bytes are not the published ones: only the file names matter here)."""
    m = get_manifest(name)
    folder = data / m.root
    for rel in m.files:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(f"{rel}\n", encoding="utf-8")
    return folder


# --- data list: the data directory itself -------------------------------------------------


@pytest.mark.parametrize("kind", ["under_a_file", "broken_link"])
def test_data_list_refuses_a_data_dir_it_cannot_hold(tmp_path: Path, kind: str) -> None:
    """$TIBNLP_DATA under a file (`afile/data`) or a link to a moved copy: every dataset was
    listed 'missing' and the command exited 0, as on a fresh install."""
    if kind == "under_a_file":
        (tmp_path / "afile").write_text("x", encoding="utf-8")
        data, culprit = tmp_path / "afile" / "data", tmp_path / "afile"
    else:
        data = culprit = tmp_path / "data"
        data.symlink_to(tmp_path / "moved", target_is_directory=True)
    code, _, exc = _data(["list"], data)
    assert code != 0
    assert isinstance(exc, DataError), exc
    assert str(culprit) in exc.message and "$TIBNLP_DATA" in str(exc.hint)
    if kind == "broken_link":
        assert str(tmp_path / "moved") in exc.message


def test_data_list_names_an_unreadable_data_dir(tmp_path: Path, monkeypatch) -> None:
    """A data directory the user may not read (tests run as root: the refusal is simulated)
    ended `data list` in a PermissionError traceback."""
    data = tmp_path / "data"
    data.mkdir()
    real = os.scandir

    def scandir(path=".", *a, **k):
        if Path(path) == data:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(os, "scandir", scandir)
    code, _, exc = _data(["list"], data)
    assert code != 0 and isinstance(exc, DataError), exc
    assert f"{data}: Permission denied" in exc.message


# --- data list: what a dataset folder holds ---------------------------------------------


def test_data_list_fails_on_a_wrong_or_partial_copy_and_names_its_files(tmp_path: Path) -> None:
    """Each was listed 'missing' (exit 0) or 'partial' without a file name; `--no-verify`
    listed all of them 'present', exit 0; a folder in place of a file raised
    IsADirectoryError. Now each says what is wrong and where, and the exit is 1 either way."""
    data = tmp_path / "data"
    (data / "tncc").mkdir(parents=True)  # a wrong folder linked or copied: none of its files
    (data / "tusa").write_text("", encoding="utf-8")  # not a folder
    wcm = _copy_of("wcm_bo", data)
    (wcm / "wcm_bo_test.jsonl").unlink()  # a split missing
    (wcm / "labels.json").unlink()
    (wcm / "labels.json").mkdir()  # a folder where a file goes
    for args in (["list"], ["list", "--no-verify"]):
        code, out, exc = _data(args, data)
        assert code == 1, (args, out, exc)
        assert f"tncc in {data / 'tncc'}: holds none of its 4 files" in out
        assert f"tusa in {data / 'tusa'}: not a folder" in out
        assert "partial: missing wcm_bo_test.jsonl, labels.json (not a file)" in out
        assert "hint:" in out


def test_data_list_names_every_changed_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _copy_of("wcm_bo", data)  # no file has its published bytes
    code, out, _ = _data(["list"], data)
    assert code == 1
    m = get_manifest("wcm_bo")
    assert f"checksum mismatch: {', '.join(m.files)}" in out  # was: the first one only
    code, out, _ = _data(["list", "--no-verify"], data)  # not hashed: the names are there
    assert code == 0 and "damaged" not in out


def test_data_list_reports_an_unreadable_file_instead_of_a_traceback(
    tmp_path: Path, monkeypatch
) -> None:
    from tibnlp.data import manifests

    data = tmp_path / "data"
    wcm = _copy_of("wcm_bo", data)
    locked = wcm / "wcm_bo_train.jsonl"
    real = manifests.sha256_file

    def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
        if Path(path) == locked:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, chunk)

    monkeypatch.setattr(manifests, "sha256_file", sha256_file)
    code, out, exc = _data(["list"], data)
    assert code == 1, exc
    assert f"unreadable: {locked} (Permission denied)" in out


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any folder whatever its mode")
def test_data_list_with_a_folder_it_may_not_read(tmp_path: Path) -> None:
    data = tmp_path / "data"
    wcm = _copy_of("wcm_bo", data)
    wcm.chmod(0)
    try:
        code, out, _ = _data(["list"], data)
    finally:
        wcm.chmod(0o755)
    assert code == 1 and "unreadable:" in out and "Permission denied" in out


def test_a_complete_copy_is_still_present(tmp_path: Path, monkeypatch) -> None:
    from tibnlp.data import manifests

    data = tmp_path / "data"
    _copy_of("wcm_bo", data)
    m = get_manifest("wcm_bo")
    monkeypatch.setenv("TIBNLP_DATA", str(data))
    monkeypatch.setattr(manifests, "sha256_file", lambda p, chunk=0: m.files[Path(p).name])
    assert all_manifests()["wcm_bo"].status() == "present"


# --- data link ----------------------------------------------------------------------------


def test_data_link_of_a_dataset_folder_itself_says_to_give_its_parent(tmp_path: Path) -> None:
    """`tibnlp data link /copy/data/tncc` (one level too deep) said only 'holds no dataset
    folders, expected folders like tncc/'."""
    folder = _copy_of("tncc", tmp_path / "copy")
    code, _, exc = _data(["link", str(folder)], tmp_path / "data")
    assert code != 0 and isinstance(exc, DataError), exc
    assert f"give {folder.parent}" in str(exc.hint)
    code, _, exc = _data(["link", str(tmp_path / "nowhere")], tmp_path / "data")
    assert isinstance(exc, DataError) and exc.message.endswith("does not exist")


def test_data_link_into_an_unwritable_data_dir_is_a_data_error(tmp_path: Path, monkeypatch) -> None:
    """No write permission on the data directory ended `data link` in a PermissionError
    traceback (simulated: tests run as root)."""
    _copy_of("tncc", tmp_path / "copy")

    def refuse(self, *a, **k):
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(Path, "symlink_to", refuse)
    code, _, exc = _data(["link", str(tmp_path / "copy")], tmp_path / "data")
    assert code != 0 and isinstance(exc, DataError), exc
    assert str(tmp_path / "data" / "tncc") in exc.message and "Permission denied" in exc.message
    assert "$TIBNLP_DATA" in str(exc.hint)


def test_data_link_says_how_to_replace_an_entry_in_the_way(tmp_path: Path) -> None:
    """A link to an older copy is left alone (on purpose); the run now says what to do to use
    the new copy instead."""
    _copy_of("tncc", tmp_path / "old")
    _copy_of("tncc", tmp_path / "new")
    data = tmp_path / "data"
    assert _data(["link", str(tmp_path / "old")], data)[0] == 0
    code, out, _ = _data(["link", str(tmp_path / "new")], data)
    assert code == 0
    assert f"tncc (links to {tmp_path / 'old' / 'tncc'})" in out
    assert f"remove them from {data} and link again" in out
    code, out, _ = _data(["link", str(tmp_path / "old")], data)  # the same copy: nothing to do
    assert "remove them" not in out


# --- long documents: what a document_max_len and a saved reading say --------------------


def test_a_document_cap_below_one_window_is_read_as_set(env) -> None:  # noqa: F811
    """`finetune.document_max_len` under the window (a cheap CPU run's 128 beside a 512-token
    model) was raised to the window without a word: every document was read to 8 tokens when
    5 were asked for, and the cut counts were those of the window."""
    from tibnlp.data.tasks import load_tncc
    from tibnlp.models.classifier_io import read_length
    from tibnlp.text.vocab import Vocabulary
    from tibnlp.training.finetune import prepare

    e = env
    cap, window = 5, 8
    data = load_tncc("title")
    setup = prepare(
        _cfg(e, "segments", f"finetune.max_len={window}", f"finetune.document_max_len={cap}"),
        data,
    )
    assert setup.meta.max_len == window and read_length(setup.meta) == cap
    assert max(len(x) for x in setup.ids["train"]) == cap
    vocab = Vocabulary.load(e.vocab)
    over = [len(vocab.encode(t)) - (cap - 2) for t in data.texts("train")]
    assert setup.cut["train"] == {
        "texts": sum(d > 0 for d in over),
        "tokens_dropped": sum(d for d in over if d > 0),
    }


def test_a_saved_reading_with_a_one_token_window_is_refused_at_load() -> None:
    """A classifier.yaml whose reading has `window: 1` loaded, then `predict` failed in the
    segmenting with a bare ValueError."""
    from tibnlp.config.core import from_dict
    from tibnlp.errors import ConfigError
    from tibnlp.models.long_documents.reading import Reading

    for mode in ("segments", "memory"):
        with pytest.raises(ConfigError, match=r"config key 'reading\.window'"):
            from_dict(Reading, {"mode": mode, "window": 1}, "reading")
    assert from_dict(Reading, {"mode": "segments", "window": 0}, "reading").window == 0
