"""A researcher's own text through `tibnlp corpus prepare` and `tibnlp vocab build`: folders of
folders, classic Mac line endings, compressions that are not read, files of a few long lines,
a run with corpus.words stopped while segmenting, sentences SentencePiece skips."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from tibetan_fixtures import save_prepared, write_prepared
from typer.testing import CliRunner

from tibnlp.cli.main import app
from tibnlp.config import CorpusConfig, VocabConfig
from tibnlp.errors import DataError
from tibnlp.text import readers
from tibnlp.text.prepare import load_prepared, prepare_corpus
from tibnlp.text.readers import InputInfo, read_documents
from tibnlp.text.vocab_build import build_vocabulary

S1 = "བཀྲ་ཤིས་བདེ་ལེགས།"
S2 = "ཁྱེད་རང་སྐུ་གཟུགས་བདེ་པོ་ཡིན་པས།"
S3 = "ང་བདེ་པོ་ཡིན།"


def _cfg(**kw: object) -> CorpusConfig:
    return CorpusConfig(**{"num_proc": 1, "heldout_fraction": 0.0, **kw})  # type: ignore[arg-type]


def _rows(out: Path) -> list[tuple[str, list[str]]]:
    return [(r["source"], r["sentences"]) for r in load_prepared(out)["train"].to_list()]


def _no_leftovers(parent: Path) -> None:
    assert [p.name for p in parent.iterdir() if p.name.startswith(".out")] == []


def test_the_subfolders_of_an_input_folder_are_read(tmp_path: Path) -> None:
    """`--input corpus/` with corpus/2019/*.txt and corpus/2020/*.txt read only corpus/*.txt:
    the years' text was left out without a word (or, with no file at the top, the folder was
    said to hold no text). Hidden folders, a link back up and a corpus prepared into the
    folder (its report.json is no JSONL input) are passed over."""
    root = tmp_path / "corpus"
    for folder, text in (("2019", S2), ("2020", S3), (".git", "ཀ་ཁ་ག་ང་ཅ་ཆ།")):
        (root / folder).mkdir(parents=True)
        (root / folder / "news.txt").write_text(text + "\n", encoding="utf-8")
    (root / "top.txt").write_text(S1 + "\n", encoding="utf-8")
    (root / "2020" / "up").symlink_to(root)
    prepare_corpus([root / "2019" / "news.txt"], root / "old", _cfg(), progress=False)
    report = prepare_corpus([root], tmp_path / "out", _cfg(), progress=False)
    assert _rows(tmp_path / "out") == [
        ("2019/news.txt", [S2]),
        ("2020/news.txt", [S3]),
        ("top.txt", [S1]),
    ]
    assert [i["source"] for i in report["inputs"]] == ["2019/news.txt", "2020/news.txt", "top.txt"]

    only_deeper = tmp_path / "years"
    (only_deeper / "2021").mkdir(parents=True)
    (only_deeper / "2021" / "a.txt").write_text(S1 + "\n", encoding="utf-8")
    prepare_corpus([only_deeper], tmp_path / "out2", _cfg(), progress=False)
    assert _rows(tmp_path / "out2") == [("a.txt", [S1])]


def test_classic_mac_line_endings_keep_lines_and_documents_apart(tmp_path: Path) -> None:
    """A file whose lines end in a lone CR was read as one line: its blank lines no longer
    ended documents (three became one), and lines without a shad ran into one sentence."""
    mac = tmp_path / "mac.txt"
    mac.write_bytes(f"{S1}\rཀ་ཁ་ག་ང\rཅ་ཆ་ཇ་ཉ\r\r{S2}\r\r{S3}".encode())
    report = prepare_corpus([mac], tmp_path / "out", _cfg(), progress=False)
    assert _rows(tmp_path / "out") == [
        ("mac.txt", [S1, "ཀ་ཁ་ག་ང", "ཅ་ཆ་ཇ་ཉ"]),
        ("mac.txt", [S2]),
        ("mac.txt", [S3]),
    ]
    assert report["inputs"][0]["lines"] == 7
    # the same in JSONL, where one line held every record ("invalid JSON (Extra data)")
    records = [json.dumps({"text": s}, ensure_ascii=False) for s in (S1, S2)]
    jsonl = tmp_path / "mac.jsonl"
    jsonl.write_bytes("\r".join(records).encode() + b"\r")
    prepare_corpus([jsonl], tmp_path / "out2", _cfg(), progress=False)
    assert _rows(tmp_path / "out2") == [("mac.jsonl", [S1]), ("mac.jsonl", [S2])]


def test_a_cr_inside_a_bad_line_is_named_by_its_own_line(tmp_path: Path) -> None:
    bad = tmp_path / "mac.txt"
    bad.write_bytes(f"{S1}\r{S2}\r".encode() + b"caf\xe9\r" + f"{S3}\r".encode())
    with pytest.raises(DataError, match=r"mac\.txt:3: invalid UTF-8"):
        prepare_corpus([bad], tmp_path / "out", _cfg(), progress=False)
    report = prepare_corpus([bad], tmp_path / "out", _cfg(on_error="skip"), progress=False)
    assert report["dropped_lines"]["invalid_utf8"] == 1
    assert report["total"]["sentences"] == 3


ZSTD = b"\x28\xb5\x2f\xfd" + bytes(20)


@pytest.mark.parametrize(
    ("name", "data", "said"),
    [
        ("news.txt.zst", ZSTD, "zstd-compressed"),
        ("news.txt", ZSTD, "zstd-compressed"),  # by its first bytes
        ("news.txt.zip", b"PK\x03\x04" + bytes(20), "a zip archive"),
        ("news.tar.gz", b"\x1f\x8b" + bytes(20), "a tar archive"),
    ],
    ids=["zst-suffix", "zst-magic", "zip", "tar"],
)
def test_a_compression_that_is_not_read_is_named(
    tmp_path: Path, name: str, data: bytes, said: str
) -> None:
    """A zstd file given as input was refused as "invalid UTF-8: NUL bytes (UTF-16 or UTF-32
    text...)" with an iconv hint; now the compression is named and what to do with it."""
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(DataError, match=f"{name} is {said}, which cannot be read") as info:
        prepare_corpus([path], tmp_path / "out", _cfg(), progress=False)
    assert "xz" in (info.value.hint or "") or "tar -xf" in (info.value.hint or "")
    assert not (tmp_path / "out").exists()
    _no_leftovers(tmp_path)


def test_a_compressed_text_in_a_folder_is_named_not_left_out(tmp_path: Path) -> None:
    """`a.txt` and `b.txt.zst` in one folder: b was left out of the corpus without a word."""
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.txt").write_text(S1 + "\n", encoding="utf-8")
    (folder / "b.txt.zst").write_bytes(ZSTD)
    (folder / "photos.zip").write_bytes(b"PK\x03\x04")  # no text suffix: not an input
    with pytest.raises(DataError, match=r"b\.txt\.zst is zstd-compressed"):
        prepare_corpus([folder], tmp_path / "out", _cfg(), progress=False)
    (folder / "b.txt.zst").unlink()
    prepare_corpus([folder], tmp_path / "out", _cfg(), progress=False)
    assert _rows(tmp_path / "out") == [("a.txt", [S1])]


def test_reading_progress_moves_within_a_file_of_long_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reading bar moved every 2048 lines only: a file of a few long lines (a book per
    JSONL record, a scraped page per line) stayed at 0 bytes until its end."""
    monkeypatch.setattr(readers, "_ADVANCE_BYTES", 1000, raising=False)  # a MiB, in small
    line = "ཀ་ཁ་ག་ང་" * 60  # 720 bytes
    path = tmp_path / "long.txt"
    path.write_text(f"{line}\n\n" * 5, encoding="utf-8")
    calls: list[int] = []
    seen = []
    info = InputInfo(path=str(path), size=path.stat().st_size)
    for _doc in read_documents(path, info, advance=calls.append):
        seen.append(sum(calls))
    assert seen[-1] > 0  # moved before the file ended
    assert seen == sorted(seen)
    assert sum(calls) == path.stat().st_size  # and ends exactly at the file's size


def test_rerun_after_the_words_were_interrupted_says_how_to_resume(tmp_path: Path) -> None:
    """`corpus prepare --set corpus.words=true` stopped while segmenting leaves the corpus
    published without words/; running it again said only "pass --force", which prepares
    everything again and drops the word shards already done."""
    src = tmp_path / "a.txt"
    src.write_text(f"{S1}\n\n{S2}\n", encoding="utf-8")
    out = tmp_path / "out"
    prepare_corpus([src], out, _cfg(), progress=False)  # what the interrupted run published
    with pytest.raises(DataError, match="without its botok words") as info:
        prepare_corpus([src], out, _cfg(words=True), progress=False)
    assert f"tibnlp corpus words {out}" in (info.value.hint or "")
    assert "--force" in (info.value.hint or "")
    with pytest.raises(DataError, match="already exists") as plain:  # words not asked for
        prepare_corpus([src], out, _cfg(), progress=False)
    assert "corpus words" not in (plain.value.hint or "")


def _corpus_with_long_sentences(path: Path, long: int) -> tuple[Path, int]:
    """A prepared corpus whose sentences are short, but `long` of them; returns the byte
    length of its longest short sentence."""
    rng = random.Random(0)
    template = write_prepared(path.parent / "template", n_docs=40, heldout=5)
    docs = load_prepared(template)
    rows = [*docs["heldout"].to_list(), *docs["train"].to_list()]
    short = max(len(s.encode()) for r in rows for s in r["sentences"])
    for i in range(long):
        text = "་".join(rng.choice(["ཀ", "ཁ", "ག", "ང"]) for _ in range(short // 3)) + "།"
        rows[5 + i]["sentences"].append(text)  # train documents
    return save_prepared(path, rows, 5, {"documents": len(rows)}), short


def test_sentences_longer_than_sentencepiece_takes_are_counted(tmp_path: Path) -> None:
    """SentencePiece skips a sentence longer than vocab.max_sentence_length without a word;
    the report and the command now say how many it skipped."""
    corpus, short = _corpus_with_long_sentences(tmp_path / "corpus", long=3)
    config = VocabConfig(vocab_size=100, num_threads=1, max_sentence_length=short)
    report = build_vocabulary(corpus, tmp_path / "v", config)
    assert report["too_long_sentences"] == 3
    assert report["longest_sentence_bytes"] > short
    saved = json.loads((tmp_path / "v" / "report.json").read_text(encoding="utf-8"))
    assert saved["too_long_sentences"] == 3
    res = CliRunner().invoke(
        app,
        [
            "vocab",
            "build",
            "--corpus",
            str(corpus),
            "--output",
            str(tmp_path / "v2"),
            "--vocab-size",
            "100",
            "--set",
            f"vocab.max_sentence_length={short}",
            "--set",
            "vocab.num_threads=1",
        ],
    )
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())
    assert "skipped 3 train sentence(s) longer than vocab.max_sentence_length" in said


def test_a_corpus_of_sentences_all_too_long_is_named_before_training(tmp_path: Path) -> None:
    """Text without shads gives sentences of a whole line; when all are longer than
    vocab.max_sentence_length the user read "SentencePiece could not train: INTERNAL:
    src/trainer_interface.cc(467) [!sentences_.empty()]"."""
    lines = [
        "་".join(random.Random(i).choice(["ཀ", "ཁ", "ག"]) for _ in range(80)) for i in range(6)
    ]
    src = tmp_path / "noshad.txt"
    src.write_text("\n\n".join(lines), encoding="utf-8")
    prepare_corpus([src], tmp_path / "corpus", _cfg(dedup=False), progress=False)
    config = VocabConfig(vocab_size=30, num_threads=1, max_sentence_length=100)
    with pytest.raises(DataError, match=r"all 6 train sentence\(s\) are longer than") as info:
        build_vocabulary(tmp_path / "corpus", tmp_path / "v", config)
    assert "vocab.max_sentence_length=100" in info.value.message
    assert f"vocab.max_sentence_length={len(lines[0].encode())}" in (info.value.hint or "")
    assert not (tmp_path / "v").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".v")] == []
