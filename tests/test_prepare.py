"""`tibnlp corpus prepare`: report figures on a hand-made corpus, formats, every bad input."""

from __future__ import annotations

import gzip
import hashlib
import json
import lzma
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tibnlp.config import CorpusConfig
from tibnlp.errors import DataError
from tibnlp.text.corpus_words import corpus_key
from tibnlp.text.normalize import normalize
from tibnlp.text.prepare import RUN_FILE, load_prepared, prepare_corpus
from tibnlp.text.sentences import split_sentences
from tibnlp.text.syllables import count_syllables
from tibnlp.tracking import path_hash

S1 = "བཀྲ་ཤིས་བདེ་ལེགས།"  # 4 syllables
S2 = "ཁྱེད་རང་སྐུ་གཟུགས་བདེ་པོ་ཡིན་པས།"  # 8 syllables: long enough to be deduplicated
S3 = "ང་བདེ་པོ་ཡིན།"  # 4 syllables

CORPUS = "\n".join(
    [
        f"{S1} {S2}",
        "Hello world, this line is English",  # too_little_tibetan
        "ཀ།",  # too_few_syllables
        "",
        f"{S2} {S3}",  # S2 again: duplicate
        S1,  # short (4 < 8 syllables): kept although repeated
        "",
        "",
        "\u200b",  # a document whose only line normalises to nothing
        "",
    ]
)


def _cfg(**kw: object) -> CorpusConfig:
    base: dict[str, object] = {"num_proc": 1, "heldout_fraction": 0.0}
    base.update(kw)
    return CorpusConfig(**base)  # type: ignore[arg-type]


def _leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "small.txt"
    path.write_text(CORPUS, encoding="utf-8")
    return path


def test_report_figures_on_known_corpus(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    report = prepare_corpus([corpus], out, _cfg(), progress=False)
    total = report["total"]
    assert total["documents"] == 2
    assert total["sentences"] == 4
    assert total["syllables"] == 4 + 8 + 4 + 4
    assert total["characters"] == len(S1) * 2 + len(S2) + len(S3)
    assert report["dropped_lines"] == {"empty": 1, "too_few_syllables": 1, "too_little_tibetan": 1}
    assert report["dropped_sentences"] == {"duplicate": 1}
    assert report["dropped_documents"] == {"no_kept_lines": 1, "all_duplicates": 0}
    assert report["inputs"][0]["name"] == "small.txt"
    assert report["inputs"][0]["lines"] == 9
    assert len(report["inputs"][0]["sha256"]) == 64
    assert report["inputs"][0]["size"] == corpus.stat().st_size

    ds = load_prepared(out)
    assert set(ds) == {"train", "heldout"} and len(ds["heldout"]) == 0
    rows = ds["train"].to_list()
    assert [r["doc_id"] for r in rows] == [0, 1]
    assert [r["source"] for r in rows] == ["small.txt", "small.txt"]
    assert rows[0]["sentences"] == [S1, S2]
    assert rows[1]["sentences"] == [S3, S1]
    assert ds["train"].features["doc_id"].dtype == "int64"
    run = {"num_proc", "seconds", "seconds_by_step"}  # returned, not in report.json
    assert json.loads((out / "report.json").read_text()) == {
        k: v for k, v in report.items() if k not in run
    }
    assert json.loads((out / "tibnlp-corpus.json").read_text()) == {
        "kind": "prepared_corpus",
        "version": 1,
    }
    saved = yaml.safe_load((out / "corpus.yaml").read_text(encoding="utf-8"))
    assert saved["corpus"]["min_syllables"] == 2 and "num_proc" not in saved["corpus"]
    assert saved["inputs"] == [{"source": "small.txt", "sha256": report["inputs"][0]["sha256"]}]
    made = json.loads((out / RUN_FILE).read_text(encoding="utf-8"))
    assert made["inputs"] == [str(corpus.resolve())] and made["num_proc"] == 1
    assert _leftovers(tmp_path) == []


def test_dedup_threshold_and_off(corpus: Path, tmp_path: Path) -> None:
    strict = prepare_corpus([corpus], tmp_path / "a", _cfg(dedup_min_syllables=1), False)
    assert strict["dropped_sentences"]["duplicate"] == 2  # S2 and the repeated S1
    off = prepare_corpus([corpus], tmp_path / "b", _cfg(dedup=False), False)
    assert off["dropped_sentences"]["duplicate"] == 0 and off["total"]["sentences"] == 5


def test_one_file_given_twice_is_refused(corpus: Path, tmp_path: Path) -> None:
    """Read twice, a file's documents could land on both sides of the held-out split (with
    deduplication off, or sentences under its length floor): held-out text trained on."""
    (tmp_path / "in").mkdir()
    inside = tmp_path / "in" / corpus.name
    inside.write_bytes(corpus.read_bytes())
    (tmp_path / "link.txt").symlink_to(inside)
    for inputs in ([corpus, corpus], [tmp_path / "in", inside], [inside, tmp_path / "link.txt"]):
        with pytest.raises(DataError, match="is given twice") as err:
            prepare_corpus(inputs, tmp_path / "out", _cfg(dedup=False), False)
        assert str(inside if inputs[0] != corpus else corpus) in str(err.value)
        assert not (tmp_path / "out").exists()


def test_formats_jsonl_gz_xz_and_folders(tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.jsonl").write_text(
        json.dumps({"body": f"{S1}\n{S3}"}, ensure_ascii=False)
        + "\n\n"
        + json.dumps({"body": S2}, ensure_ascii=False)
        + "\n",
        encoding="utf-8",
    )
    with gzip.open(src / "b.txt.gz", "wt", encoding="utf-8") as fh:
        fh.write(f"{S1}\n\n{S2}\n")
    with lzma.open(src / "c.txt.xz", "wt", encoding="utf-8") as fh:
        fh.write(f"{S3}\r\n")  # CRLF
    report = prepare_corpus([src], tmp_path / "out", _cfg(field="body", dedup=False), False)
    assert [i["name"] for i in report["inputs"]] == ["a.jsonl", "b.txt.gz", "c.txt.xz"]
    assert [i["documents"] for i in report["inputs"]] == [2, 2, 1]
    rows = load_prepared(tmp_path / "out")["train"].to_list()
    assert rows[0]["sentences"] == [S1, S3]  # one JSONL record = one document
    assert [r["source"] for r in rows] == ["a.jsonl", "a.jsonl", "b.txt.gz", "b.txt.gz", "c.txt.xz"]


def test_heldout_by_document_and_no_sentence_shared(tmp_path: Path) -> None:
    docs = [f"{S1} ཡི་གེ་{n}་པ་འདི་ནི་ཡིག་ཆ་གཅིག་ཡིན།" for n in "༠༡༢༣༤༥༦༧༨༩"]
    (tmp_path / "d.txt").write_text("\n\n".join(docs * 4), encoding="utf-8")
    cfg = _cfg(heldout_fraction=0.25, dedup_min_syllables=1)
    report = prepare_corpus([tmp_path / "d.txt"], tmp_path / "out", cfg, False)
    ds = load_prepared(tmp_path / "out")
    train = {s for doc in ds["train"]["sentences"] for s in doc}
    heldout = {s for doc in ds["heldout"]["sentences"] for s in doc}
    assert not train & heldout
    assert report["splits"]["heldout"]["documents"] == len(ds["heldout"]) > 0
    again = prepare_corpus([tmp_path / "d.txt"], tmp_path / "out2", cfg, False)
    assert again["splits"] == report["splits"]


def test_files_of_the_same_name_are_distinct_sources(tmp_path: Path) -> None:
    """Two `news.txt` in different folders were one source "news.txt": their figures were
    summed in `by_source` and the held-out draw, stratified by source, pooled them."""
    for folder, docs in (("tibettimes", [S1, S2]), ("nanhai", [S3])):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "news.txt").write_text("\n\n".join(docs), encoding="utf-8")
    (tmp_path / "extra.txt").write_text(S2 + "\n", encoding="utf-8")
    inputs = [tmp_path / "tibettimes", tmp_path / "nanhai" / "news.txt", tmp_path / "extra.txt"]
    report = prepare_corpus(inputs, tmp_path / "out", _cfg(dedup=False), False)
    assert {k: v["documents"] for k, v in report["by_source"].items()} == {
        "tibettimes/news.txt": 2,
        "nanhai/news.txt": 1,
        "extra.txt": 1,
    }
    assert [i["source"] for i in report["inputs"]] == [
        "tibettimes/news.txt",
        "nanhai/news.txt",
        "extra.txt",
    ]
    rows = load_prepared(tmp_path / "out")["train"].to_list()
    assert [r["source"] for r in rows][:3] == ["tibettimes/news.txt"] * 2 + ["nanhai/news.txt"]


def test_source_names_of_a_large_input_folder(tmp_path: Path) -> None:
    """A corpus given as folders of many files (the names used to be found by comparing every
    pair: 3,000 files took ~30 s): unique names stay plain, names that collide get as many
    folders as tell them apart, and one file given twice stays one source."""
    from tibnlp.text.input_files import source_names

    files = [tmp_path / f"d{i % 40}" / f"f{i}.txt" for i in range(3000)]
    files += [tmp_path / "a" / "x" / "news.txt", tmp_path / "b" / "x" / "news.txt"]
    files += [tmp_path / "c" / "news.txt", files[0]]  # the same file twice: one source
    names = source_names(files)
    assert len(set(names[:3000])) == 3000
    assert names[:2] == ["f0.txt", "f1.txt"]
    assert names[-4:] == ["a/x/news.txt", "b/x/news.txt", "c/news.txt", "f0.txt"]


def test_two_processes_give_the_same_corpus(corpus: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy.txt"  # a second input, for documents on both processes
    copy.write_bytes(corpus.read_bytes())
    one = prepare_corpus([corpus, copy], tmp_path / "one", _cfg(num_proc=1), False)
    two = prepare_corpus([corpus, copy], tmp_path / "two", _cfg(num_proc=2), False)
    assert one["total"] == two["total"] and one["dropped_lines"] == two["dropped_lines"]
    rows_one = load_prepared(tmp_path / "one")["train"].to_list()
    assert rows_one == load_prepared(tmp_path / "two")["train"].to_list()


def test_the_bars_are_on_stderr(
    corpus: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The reading and processing bars went to stdout (rich's default console)."""
    prepare_corpus([corpus], tmp_path / "out", _cfg(num_proc=2), True)
    said = capfd.readouterr()
    assert said.out == "" and "reading" in said.err.lower()


def _file_hashes(folder: Path) -> dict[str, str]:
    return {
        f.relative_to(folder).as_posix(): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(folder.rglob("*"))
        if f.is_file()
    }


def test_identical_preparations_are_the_same_bytes(corpus: Path, tmp_path: Path) -> None:
    """The same inputs and settings give the same files, whatever the process count, the
    output folder or the folder the inputs are read from: the caches keyed on the corpus
    (pretraining data and corpus words: report.json and the split fingerprints; pipeline
    inputs: `path_hash`) find it again. Before, state.json held a fingerprint of the staging
    folder's path and report.json the seconds taken, so they were built again for nothing."""
    second = corpus.read_text(encoding="utf-8") + f"\n\n{S3}\n"
    for folder in ("here", "there"):  # the same files in two places
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "a.txt").write_text(CORPUS, encoding="utf-8")
        (tmp_path / folder / "b.txt").write_text(second, encoding="utf-8")

    def prepare(folder: str, out: str, **cfg: object) -> Path:
        files = [tmp_path / folder / "a.txt", tmp_path / folder / "b.txt"]
        prepare_corpus(files, tmp_path / out, _cfg(heldout_fraction=0.3, **cfg), False)
        return tmp_path / out

    def key(out: Path) -> str:
        return corpus_key(out, load_prepared(out))

    one = prepare("here", "one", num_proc=1)
    two = prepare("there", "two", num_proc=2)
    files = _file_hashes(one)
    assert {"report.json", "corpus.yaml", "dataset/train/state.json"} <= set(files)
    assert {k: v for k, v in files.items() if k != RUN_FILE} == {
        k: v for k, v in _file_hashes(two).items() if k != RUN_FILE
    }
    assert key(one) == key(two) and path_hash(one) == path_hash(two)
    assert len(load_prepared(one)["heldout"]) > 0  # both splits were compared

    lines = (tmp_path / "there" / "b.txt").read_text(encoding="utf-8").splitlines()
    lines[-1] = "ཀ་ཁ་ག་ང་ཅ།"  # one line changed
    (tmp_path / "there" / "b.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    changed = prepare("there", "changed", num_proc=2)
    fingerprints = [
        {s: d._fingerprint for s, d in load_prepared(o).items()} for o in (one, changed)
    ]
    assert fingerprints[0] != fingerprints[1]
    assert key(changed) != key(one) and path_hash(changed) != path_hash(one)
    setting = prepare("here", "setting", num_proc=1, dedup=False)  # a setting changed
    assert key(setting) != key(one) and path_hash(setting) != path_hash(one)


def _expect_error(tmp_path: Path, inputs: list[Path], match: str, **cfg: object) -> None:
    out = tmp_path / "out"
    with pytest.raises(DataError, match=match):
        prepare_corpus(inputs, out, _cfg(**cfg), progress=False)
    assert not out.exists()
    assert _leftovers(tmp_path) == []


def test_missing_input(tmp_path: Path) -> None:
    _expect_error(tmp_path, [tmp_path / "nope.txt"], r"nope\.txt does not exist")


@pytest.mark.parametrize("suffix", [".xz", ".gz"])
def test_corrupt_compression(tmp_path: Path, suffix: str) -> None:
    data = (f"{S1}\n" * 2000).encode()
    packed = lzma.compress(data) if suffix == ".xz" else gzip.compress(data)
    bad = tmp_path / f"bad.txt{suffix}"
    bad.write_bytes(packed[: len(packed) // 2])  # truncated
    _expect_error(tmp_path, [bad], rf"bad\.txt\{suffix}.*cannot decompress")
    bad.write_bytes(b"not compressed at all")
    _expect_error(tmp_path, [bad], rf"bad\.txt\{suffix}.*cannot decompress")


def test_invalid_utf8_names_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(f"{S1}\n{S2}\n".encode() + b"caf\xe9 \xff\n" + f"{S3}\n".encode())
    _expect_error(tmp_path, [bad], r"latin1\.txt:3: invalid UTF-8")
    report = prepare_corpus([bad], tmp_path / "out", _cfg(on_error="skip"), progress=False)
    assert report["dropped_lines"]["invalid_utf8"] == 1
    assert report["inputs"][0]["skipped_lines"] == {"invalid_utf8": 1}
    assert report["total"]["sentences"] == 3


def test_bad_jsonl(tmp_path: Path) -> None:
    bad = tmp_path / "x.jsonl"
    bad.write_text(json.dumps({"text": S1}, ensure_ascii=False) + "\n{oops\n", encoding="utf-8")
    _expect_error(tmp_path, [bad], r"x\.jsonl:2: invalid JSON")
    _expect_error(tmp_path, [bad], r"x\.jsonl:1: no string field 'body'", field="body")
    report = prepare_corpus([bad], tmp_path / "out", _cfg(on_error="skip"), progress=False)
    assert report["dropped_lines"]["invalid_json"] == 1


def test_a_jsonl_text_with_a_lone_surrogate_escape_is_named(tmp_path: Path) -> None:
    """A cut emoji ("\\ud83d") is valid JSON but no character: it ended in a UnicodeEncodeError
    traceback from the Arrow writer, naming no line, and --on-error skip did not skip it."""
    bad = tmp_path / "scraped.jsonl"
    good = json.dumps({"text": S1}, ensure_ascii=False)
    bad.write_text(good + '\n{"text": "\\ud83d' + S1 + '"}\n', encoding="utf-8")
    _expect_error(tmp_path, [bad], r"scraped\.jsonl:2: field 'text' holds an unpaired surrogate")
    report = prepare_corpus([bad], tmp_path / "out", _cfg(on_error="skip"), progress=False)
    assert report["dropped_lines"]["invalid_utf8"] == 1 and report["total"]["documents"] == 1


def test_file_without_tibetan(tmp_path: Path, corpus: Path) -> None:
    latin = tmp_path / "english.txt"
    latin.write_text("Only English here.\n\nAnd here.\n", encoding="utf-8")
    _expect_error(tmp_path, [corpus, latin], r"english\.txt: no Tibetan text in 3 line")


def test_empty_result(tmp_path: Path) -> None:
    short = tmp_path / "short.txt"
    short.write_text("ཀ།\nཁ།\n", encoding="utf-8")
    _expect_error(tmp_path, [short], r"would be empty.*too_few_syllables: 2")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    _expect_error(tmp_path, [empty], r"empty\.txt: no Tibetan")


def test_existing_output(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    prepare_corpus([corpus], out, _cfg(), progress=False)
    with pytest.raises(DataError, match="already exists"):
        prepare_corpus([corpus], out, _cfg(), progress=False)
    prepare_corpus([corpus], out, _cfg(dedup=False), progress=False, force=True)
    assert load_prepared(out)["train"].num_rows == 2
    assert json.loads((out / "report.json").read_text())["dropped_sentences"]["duplicate"] == 0
    other = tmp_path / "precious"
    other.mkdir()
    (other / "thesis.tex").write_text("x")
    with pytest.raises(DataError, match="not a prepared corpus; refusing"):
        prepare_corpus([corpus], other, _cfg(), progress=False, force=True)
    assert (other / "thesis.tex").exists()
    assert _leftovers(tmp_path) == []


def test_load_prepared_rejects_other_dirs(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="is not a prepared corpus") as info:
        load_prepared(tmp_path)
    assert "tibnlp corpus prepare" in (info.value.hint or "")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the CLI; stderr comes back unwrapped (rich wraps at the terminal width)."""
    result = subprocess.run(
        [sys.executable, "-m", "tibnlp.cli.main", "corpus", "prepare", *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "COLUMNS": "400"},
    )
    result.stderr = " ".join(result.stderr.split())
    return result


def test_cli_success_and_failure(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    ok = _cli("--input", str(corpus), "--output", str(out), "--num-proc", "1", "--no-progress",
              "--set", "corpus.heldout_fraction=0")  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert "sentences" in ok.stderr and "too_little_tibetan" in ok.stderr
    assert load_prepared(out)["train"].num_rows == 2

    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe\n")
    failed = _cli("-i", str(corpus), "-i", str(bad), "-o", str(tmp_path / "out2"), "--no-progress")
    assert failed.returncode != 0
    assert "bad.txt:1: invalid UTF-8" in failed.stderr and "Traceback" not in failed.stderr
    assert not (tmp_path / "out2").exists() and _leftovers(tmp_path) == []

    missing = _cli("-i", str(tmp_path / "none.txt"), "-o", str(tmp_path / "out3"))
    assert missing.returncode != 0 and "does not exist" in missing.stderr
    assert not (tmp_path / "out3").exists()

    refused = _cli("-i", str(corpus), "-o", str(out), "--no-progress")
    assert refused.returncode != 0 and "--force" in refused.stderr

    bad_key = _cli("-i", str(corpus), "-o", str(tmp_path / "o4"), "--on-error", "ignore")
    assert bad_key.returncode != 0 and "corpus.on_error" in bad_key.stderr


def test_real_corpus_slice(require_data, tmp_path: Path) -> None:
    """A few hundred lines of the real news corpus: the report agrees with the dataset."""
    source = require_data("corpora/tibetan_tibettimes_news.txt.xz")
    lines = []
    with lzma.open(source, "rt", encoding="utf-8") as fh:
        for line in fh:
            lines.append(line)
            if len(lines) >= 300:
                break
    sample = tmp_path / "news_sample.txt"
    sample.write_text("".join(lines), encoding="utf-8")
    out = tmp_path / "out"
    report = prepare_corpus([sample], out, _cfg(heldout_fraction=0.05), progress=False)
    ds = load_prepared(out)
    n_docs = sum(1 for block in "".join(lines).split("\n\n") if block.strip())
    assert report["inputs"][0]["documents"] == n_docs
    assert report["total"]["documents"] + sum(report["dropped_documents"].values()) == n_docs
    for split in ("train", "heldout"):
        sentences = [s for doc in ds[split]["sentences"] for s in doc]
        figures = report["splits"][split]
        assert figures["documents"] == len(ds[split])
        assert figures["sentences"] == len(sentences)
        assert figures["syllables"] == sum(count_syllables(s) for s in sentences)
        assert figures["characters"] == sum(len(s) for s in sentences)
        assert all(normalize(s) == s for s in sentences)
    assert report["splits"]["heldout"]["documents"] >= 1
    # The first document starts with the sentences of its normalised first line (nothing
    # precedes it, so dedup cannot have removed them).
    first = next(r for split in ds.values() for r in split if r["doc_id"] == 0)
    expected = split_sentences(normalize(lines[0]))
    assert expected and first["sentences"][: len(expected)] == expected


def test_cli_takes_several_inputs_after_one_flag(tmp_path: Path) -> None:
    """`--input a.txt b.txt.xz` (what users type first) equals the repeated flag."""
    from typer.testing import CliRunner

    from tibnlp.cli.main import app

    (tmp_path / "a.txt").write_text(f"{S1}\n\n{S2}\n", encoding="utf-8")
    with lzma.open(tmp_path / "b.txt.xz", "wt", encoding="utf-8") as fh:
        fh.write(f"{S3}\n")
    a, b = str(tmp_path / "a.txt"), str(tmp_path / "b.txt.xz")
    common = ["--num-proc", "1", "--no-progress", "--set", "corpus.heldout_fraction=0"]
    sources = []
    for form, out in (([a, b], "one"), ([a, "-i", b], "repeated")):
        res = CliRunner().invoke(
            app, ["corpus", "prepare", "--input", *form, "-o", str(tmp_path / out), *common]
        )
        assert res.exit_code == 0, res.output
        sources.append([r["source"] for r in load_prepared(tmp_path / out)["train"].to_list()])
    assert sources[0] == sources[1] == ["a.txt", "a.txt", "b.txt.xz"]
    none = CliRunner().invoke(app, ["corpus", "prepare", "-o", str(tmp_path / "x"), *common])
    assert none.exit_code != 0 and "at least one input" in none.output
