"""QA of `corpus prepare`, `vocab build` and `data`: inputs a demanding user gives (UTF-16,
unreadable files, out-of-range settings, broken data links, Ctrl-C) and the build's progress."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from tibetan_fixtures import write_prepared
from typer.testing import CliRunner

from tibnlp.cli.main import app
from tibnlp.config import CorpusConfig, VocabConfig
from tibnlp.errors import DataError, TibnlpError
from tibnlp.text import spm_log, vocab_build
from tibnlp.text.prepare import prepare_corpus
from tibnlp.text.vocab import Vocabulary
from tibnlp.text.vocab_build import build_vocabulary

S = "བཀྲ་ཤིས་བདེ་ལེགས། ཁྱེད་རང་སྐུ་གཟུགས་བདེ་པོ་ཡིན་པས།"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_prepared(tmp_path_factory.mktemp("qa_corpus") / "prepared")


def _vcfg(**kw: Any) -> VocabConfig:
    return VocabConfig(**{"vocab_size": 200, "num_threads": 1, **kw})


def _cli(*args: str) -> Any:
    """The command's result; a TibnlpError as `tibnlp.cli.main.main` shows it (exit 2)."""
    result = CliRunner().invoke(app, list(args))
    text = result.output
    if isinstance(result.exception, TibnlpError):
        result.exit_code, text = result.exception.exit_code, f"{text} {result.exception}"
    result.flat = " ".join(text.split())  # rich wraps long lines
    return result


def test_vocab_build_reports_sentences_then_em_rounds_and_keeps_the_bytes(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture
) -> None:
    """A spinner for minutes: now the sentences read (of the split's) and the EM rounds (of
    those expected), read from SentencePiece's log, which never reaches stderr itself."""
    monkeypatch.setattr(vocab_build, "_EVERY", 100)
    calls: list[tuple[str, int, int | None]] = []
    report = build_vocabulary(corpus, tmp_path / "v", _vcfg(), lambda *c: calls.append(c))
    stages = [s for i, (s, _, _) in enumerate(calls) if i == 0 or calls[i - 1][0] != s]
    assert stages == ["reading", "seeding", "training", "evaluating"]
    reading = [(done, total) for s, done, total in calls if s == "reading"]
    assert len(reading) > 2 and all(a[0] < b[0] for a, b in itertools.pairwise(reading))
    assert reading[-1][0] == reading[-1][1]  # every sentence of the train split, of its count
    rounds = [(done, total) for s, done, total in calls if s == "training" and total]
    assert rounds and all(a[0] <= b[0] for a, b in itertools.pairwise(rounds))
    assert rounds[-1][0] == rounds[-1][1] >= 1
    assert "trainer_spec" not in capfd.readouterr().err
    plain = build_vocabulary(corpus, tmp_path / "plain", _vcfg())
    assert report["sha256"] == plain["sha256"] == Vocabulary.load(tmp_path / "v").sha256


def test_the_log_reader_counts_rounds_and_passes_errors_on() -> None:
    calls: list[tuple[str, int, int | None]] = []
    log = spm_log.TrainLog(lambda *c: calls.append(c), vocab_size=1000)  # target 1100
    head = "I0000 00:00:1.5   42 unigram_model_trainer.cc:903] "
    assert log(head + "Normalizing sentences...") is None
    assert log("  vocab_size: 1000") is None  # the settings dump goes with its message
    for sub, size in ((0, 9000), (1, 8000), (0, 6000), (1, 5900)):
        log(head + f"EM sub_iter={sub} size={size} obj=1")
    error = "E0000 00:00:1.5   42 trainer_interface.cc:9] something failed"
    assert log(error) == error
    assert calls[0] == ("seeding", 0, None) and calls[1] == ("training", 0, None)
    # a round ends at its last sub-iteration; 8000 pieces shrink by 0.75 a round to 1100 in
    # 7 more rounds (8 in all); 5900 in 6 more
    assert calls[2:] == [("training", 1, 8), ("training", 2, 8)]


def test_ctrl_c_while_sentencepiece_reads_is_an_interrupt_and_leaves_nothing(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SentencePiece's binding turned Ctrl-C in the sentence iterator into "error:
    SentencePiece could not train: INTERNAL: KeyboardInterrupt" (exit 2)."""
    monkeypatch.setattr(vocab_build, "_EVERY", 100)

    def interrupt(stage: str, done: int, total: int | None) -> None:
        if stage == "reading" and done >= 200:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_vocabulary(corpus, tmp_path / "v", _vcfg(), interrupt)
    assert list(tmp_path.iterdir()) == []


def test_vocab_build_in_a_log_prints_each_stage(corpus: Path, tmp_path: Path) -> None:
    result = _cli("vocab", "build", "--corpus", str(corpus), "--output", str(tmp_path / "v"),
                  "--vocab-size", "200", "--set", "vocab.num_threads=1")  # fmt: skip
    assert result.exit_code == 0, result.output
    for line in ("vocab: reading sentences done:", "sentences", "vocab: training (EM) done:"):
        assert line in result.flat
    assert "trainer_spec" not in result.output


@pytest.mark.parametrize(
    ("setting", "key"),
    [
        ("vocab.vocab_size=1000000000", "vocab.vocab_size"),  # was a ValueError traceback
        ("vocab.input_sentence_size=100000000000000000000", "vocab.input_sentence_size"),
        ("vocab.input_sentence_size=50", "vocab.input_sentence_size"),  # was SentencePiece's
        ("vocab.max_sentence_length=5", "vocab.max_sentence_length"),  # was SentencePiece's
        ("vocab.num_threads=5000", "vocab.num_threads"),
    ],
)
def test_settings_past_sentencepiece_limits_name_the_key(
    corpus: Path, tmp_path: Path, setting: str, key: str
) -> None:
    result = _cli("vocab", "build", "--corpus", str(corpus), "--output", str(tmp_path / "v"),
                  "--set", setting)  # fmt: skip
    assert result.exit_code == 2, result.output
    assert f"config key '{key}'" in result.flat and "Traceback" not in result.flat
    assert not (tmp_path / "v").exists()


def _prepare(tmp_path: Path, *inputs: Path, on_error: str = "fail") -> None:
    cfg = CorpusConfig(num_proc=1, heldout_fraction=0.0, on_error=on_error)  # type: ignore[arg-type]
    prepare_corpus(list(inputs), tmp_path / "out", cfg, progress=False)


@pytest.mark.parametrize("on_error", ["fail", "skip"])
def test_utf16_with_a_byte_order_mark_is_named(tmp_path: Path, on_error: str) -> None:
    """Notepad's "Unicode": "invalid UTF-8 (byte 0 ...)" said nothing of UTF-16, and with
    --on-error skip its lines went on as garbage."""
    path = tmp_path / "notepad.txt"
    path.write_bytes(f"{S}\n\n{S}\n".encode("utf-16"))
    with pytest.raises(DataError, match=r"notepad\.txt:1: invalid UTF-8: the file is UTF-16") as e:
        _prepare(tmp_path, path, on_error=on_error)
    assert "iconv -f UTF-16" in str(e.value.hint)
    assert not (tmp_path / "out").exists()


def test_nul_bytes_are_named_not_read_as_text_without_tibetan(tmp_path: Path) -> None:
    path = tmp_path / "nobom.txt"
    path.write_bytes(f"{S}\n{S}\n".encode("utf-16-le"))
    with pytest.raises(DataError, match=r"nobom\.txt:1: invalid UTF-8: NUL bytes"):
        _prepare(tmp_path, path)


def test_unreadable_input_file_and_folder_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Root reads anything, so the permission error is simulated: it was a traceback."""
    (tmp_path / "locked").mkdir()
    (tmp_path / "locked.txt").write_text(S + "\n", encoding="utf-8")
    open_, iterdir = Path.open, Path.iterdir

    def denied(self: Path, *args: Any, **kw: Any) -> Any:
        if self.name.startswith("locked"):
            raise PermissionError(13, "Permission denied", str(self))
        return (open_ if args or kw else iterdir)(self, *args, **kw)

    monkeypatch.setattr(Path, "open", denied)
    monkeypatch.setattr(Path, "iterdir", denied)
    for name, what in (("locked.txt", "input"), ("locked", "input directory")):
        result = _cli("corpus", "prepare", "-i", str(tmp_path / name), "-o",
                      str(tmp_path / "out"), "--no-progress")  # fmt: skip
        assert result.exit_code == 2, result.output
        assert f"cannot read {what} {tmp_path / name}: Permission denied" in result.flat


def test_data_list_names_a_broken_link_and_data_link_replaces_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A link whose copy moved showed as "missing" (exit 0), and `data link NEW_COPY` kept
    it ("links to ..., missing"): the user had to find and delete it by hand."""
    data, shared = tmp_path / "data", tmp_path / "shared"
    data.mkdir()
    (shared / "tusa").mkdir(parents=True)
    (data / "tusa").symlink_to(tmp_path / "moved" / "tusa", target_is_directory=True)
    monkeypatch.setenv("TIBNLP_DATA", str(data))
    listed = _cli("data", "list", "--no-verify")
    assert listed.exit_code == 1, listed.output
    assert "broken link" in listed.flat and "tibnlp data link SOURCE_DIR" in listed.flat
    linked = _cli("data", "link", str(shared))
    assert linked.exit_code == 0 and ": tusa" in linked.flat, linked.output
    assert (data / "tusa").resolve() == (shared / "tusa").resolve()
