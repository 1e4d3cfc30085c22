"""Bad labelled files, symlinked outputs and `data link`: clear errors and messages, nothing
half-published."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tibnlp.data.labelled import read_jsonl
from tibnlp.errors import DataError
from tibnlp.fsutil import staged_dir


def test_labelled_text_must_be_a_string(tmp_path: Path) -> None:
    path = tmp_path / "split.jsonl"
    path.write_text(
        json.dumps({"text": "ཀ་ཁ", "label": "A"}) + "\n" + json.dumps({"text": None, "label": "A"})
    )
    with pytest.raises(DataError, match=r"split.jsonl:2: .*'text'"):
        read_jsonl(path, ["A"], "text", "label")  # was: trained on the text "None"


def test_undecodable_labelled_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "split.jsonl"
    path.write_bytes(b'{"text": "a", "label": "A"}\n{"text": "\xff", "label": "A"}\n')
    with pytest.raises(DataError, match=r"split.jsonl:2: invalid UTF-8"):
        read_jsonl(path, ["A"], "text", "label")  # was: a bare UnicodeDecodeError


def test_staged_dir_replaces_a_symlinked_output(tmp_path: Path) -> None:
    """`corpus prepare --force` accepts OUT as a symlink to a prepared corpus; publishing then
    raised (rmtree on the link) after the new folder was in place, leaving .OUT.old-PID."""
    target = tmp_path / "real"
    target.mkdir()
    (target / "a").write_text("old")
    link = tmp_path / "out"
    link.symlink_to(target, target_is_directory=True)
    with staged_dir(link, replace=True) as tmp:
        (tmp / "a").write_text("new")
    assert (link / "a").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "real"]


def test_data_link_reports_what_it_left_alone(tmp_path: Path, monkeypatch) -> None:
    """A rerun of `tibnlp data link` said "linked 0 folder(s)" and nothing about the entries
    it kept, not even one that points elsewhere or is a real folder."""
    from typer.testing import CliRunner

    from tibnlp.cli.main import app

    shared, data = tmp_path / "shared", tmp_path / "data"
    for name in ("tncc", "tusa", "advts", "wcm_bo"):
        (shared / name).mkdir(parents=True)
    (tmp_path / "other" / "advts").mkdir(parents=True)
    data.mkdir()
    (data / "tusa").symlink_to(shared / "tusa", target_is_directory=True)
    (data / "advts").symlink_to(tmp_path / "other" / "advts", target_is_directory=True)
    (data / "wcm_bo").mkdir()
    monkeypatch.setenv("TIBNLP_DATA", str(data))
    res = CliRunner().invoke(app, ["data", "link", str(shared)])
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())
    assert "linked 1 folder(s)" in out and ": tncc" in out
    assert "left 3 existing" in out
    assert "tusa (already linked)" in out
    # rich wraps a long path anywhere: compare it without whitespace
    assert f"advts(linksto{tmp_path / 'other' / 'advts'})" in "".join(out.split())
    assert "wcm_bo (not a link)" in out
    assert (data / "tncc").resolve() == (shared / "tncc").resolve()


def test_derive_replaces_only_the_named_files_and_refuses_an_existing_output(
    tmp_path: Path,
) -> None:
    from tibnlp.data.datadir import derive

    source = tmp_path / "data"
    (source / "tncc").mkdir(parents=True)
    (source / "corpora").mkdir()
    for name in ("tncc/train.jsonl", "tncc/test.jsonl", "corpora/a.txt"):
        (source / name).write_text(name, "utf-8")
    out = tmp_path / "derived"
    derive(source, out, {"tncc/train.jsonl": "new\n"})
    assert (out / "tncc" / "train.jsonl").read_text("utf-8") == "new\n"
    assert not (out / "tncc" / "train.jsonl").is_symlink()
    assert (out / "tncc" / "test.jsonl").resolve() == (source / "tncc" / "test.jsonl").resolve()
    assert (out / "corpora").is_symlink() and (
        out / "corpora" / "a.txt"
    ).read_text() == "corpora/a.txt"
    assert (source / "tncc" / "train.jsonl").read_text("utf-8") == "tncc/train.jsonl"
    assert not (tmp_path / "derived.tmp").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "derived"]  # no staging left
    with pytest.raises(DataError, match="exists"):
        derive(source, out, {"tncc/train.jsonl": "again\n"})


def test_data_link_into_a_file_names_it_and_the_variable(tmp_path: Path, monkeypatch) -> None:
    """$TIBNLP_DATA naming a file (or a folder under one) raised FileExistsError."""
    from typer.testing import CliRunner

    from tibnlp.cli.main import app

    (tmp_path / "shared" / "tncc").mkdir(parents=True)
    afile = tmp_path / "afile"
    afile.write_text("")
    for data in (afile, afile / "data"):
        monkeypatch.setenv("TIBNLP_DATA", str(data))
        res = CliRunner().invoke(app, ["data", "link", str(tmp_path / "shared")])
        assert isinstance(res.exception, DataError), res.exception
        assert f"{afile} is a file" in str(res.exception)
        assert "$TIBNLP_DATA" in str(res.exception.hint)
    assert afile.read_text() == ""


def test_data_list_fails_on_a_damaged_dataset_and_a_file_as_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`data list` (the README's check) exited 0 with 'checksum mismatch' in its table, and
    with every dataset 'missing' when $TIBNLP_DATA named a file."""
    from typer.testing import CliRunner

    from tibnlp.cli.main import app
    from tibnlp.data.manifests import all_manifests

    m = next(m for m in all_manifests().values() if m.files)
    monkeypatch.setenv("TIBNLP_DATA", str(tmp_path / "data"))
    for rel in m.files:
        (m.path / rel).parent.mkdir(parents=True, exist_ok=True)
        (m.path / rel).write_text("not the published bytes\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["data", "list"])
    assert result.exit_code == 1, result.output
    assert "checksum mismatch" in " ".join(result.output.split())
    monkeypatch.setenv("TIBNLP_DATA", str(tmp_path / "a_file"))
    (tmp_path / "a_file").write_text("x", encoding="utf-8")
    result = CliRunner().invoke(app, ["data", "list"])
    assert "is a file, not a folder" in str(result.exception)
