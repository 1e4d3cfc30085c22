"""The SentencePiece vocabulary: fixed special ids, syllable-bounded pieces, report, bad input."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from tibetan_fixtures import write_prepared

from tibnlp.config import VocabConfig
from tibnlp.errors import DataError
from tibnlp.text.syllables import SYLLABLE_RE, TSHEG, count_syllables
from tibnlp.text.vocab import Vocabulary, is_syllable_char
from tibnlp.text.vocab_build import build_vocabulary

SIZE = 200


def _config(**kw: object) -> VocabConfig:
    return VocabConfig(**{"vocab_size": SIZE, "num_threads": 1, **kw})  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_prepared(tmp_path_factory.mktemp("corpus") / "prepared")


@pytest.fixture(scope="module")
def built(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("vocab") / "v"
    return out, build_vocabulary(corpus, out, _config())


@pytest.fixture(scope="module")
def vocab(built: tuple[Path, dict]) -> Vocabulary:
    return Vocabulary.load(built[0])


def test_special_tokens_have_fixed_ids(vocab: Vocabulary) -> None:
    pieces = [vocab.id_to_piece(i) for i in range(5)]
    assert pieces == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert (vocab.pad_id, vocab.unk_id, vocab.cls_id, vocab.sep_id, vocab.mask_id) == (
        0,
        1,
        2,
        3,
        4,
    )
    assert vocab.size == SIZE
    # control symbols: text that spells them is not turned into the special id
    assert vocab.mask_id not in vocab.encode("[MASK] ཀ་ཁ")


def test_piece_log_probs_follow_the_corpus(vocab: Vocabulary, corpus: Path) -> None:
    """The unigram log probabilities rare-first masking weighs pieces by
    (`pretrain.mask_rarity`): 0 for the special ids, negative for the EM's pieces, and a
    piece frequent in the corpus scored above one seen rarely."""
    from collections import Counter

    from tibnlp.text.prepare import load_prepared

    log_p = vocab.piece_log_probs()
    assert len(log_p) == vocab.size and log_p[:5] == [0.0] * 5
    counts: Counter[int] = Counter()
    for doc in load_prepared(corpus)["train"]:
        for sentence in doc["sentences"]:
            counts.update(vocab.encode(sentence))
    scored = [(n, i) for i, n in counts.items() if log_p[i] < 0]
    (_, common), (_, rare) = max(scored), min(scored)
    assert log_p[common] > log_p[rare]


def test_output_folder(built: tuple[Path, dict], corpus: Path) -> None:
    out, report = built
    names = {p.name for p in out.iterdir()}
    assert {"spm.model", "spm.vocab", "vocab.yaml", "report.json", "tibnlp-vocab.json"} <= names
    assert json.loads((out / "report.json").read_text()) == report
    text = (out / "vocab.yaml").read_text()
    assert "vocab_size: 200" in text and "corpus_report_sha256" in text
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temp left


def test_no_piece_crosses_a_syllable_boundary(vocab: Vocabulary) -> None:
    for i in range(5, vocab.size):
        piece = vocab.id_to_piece(i)
        cut = piece.find(TSHEG)
        if cut >= 0:  # whatever follows a tsheg inside a piece is not a new syllable
            assert not any(is_syllable_char(c) for c in piece[cut + 1 :]), piece


def test_without_split_pieces_span_syllables(corpus: Path, tmp_path: Path) -> None:
    build_vocabulary(corpus, tmp_path / "v", _config(split_on_tsheg=False))
    v = Vocabulary.load(tmp_path / "v")
    crossing = [
        p
        for p in (v.id_to_piece(i) for i in range(5, v.size))
        if TSHEG in p[:-1] and SYLLABLE_RE.search(p.split(TSHEG, 1)[1])
    ]
    assert crossing, "frequent multi-syllable words should become single pieces"


def test_encode_decode_and_batch(vocab: Vocabulary) -> None:
    texts = ["ཀ་ཁ་གང།", "བོད་ཀྱི་སྐད་ཡིག།", "ཀ\u0f0cཁ"]
    batch = vocab.encode_batch(texts)
    assert batch == [vocab.encode(t) for t in texts]
    assert vocab.decode(vocab.encode(texts[0])) == texts[0]
    assert not vocab.punctuation_pieces
    assert vocab.encode(texts[2]) == vocab.encode("ཀ་ཁ")  # normalised before encoding


def test_every_syllable_opens_with_a_word_piece(vocab: Vocabulary) -> None:
    assert vocab.split_on_tsheg
    pieces = [vocab.id_to_piece(i) for i in vocab.encode("ཀ་ཁང་གད། །ངར")]
    assert sum(p.startswith("\u2581") for p in pieces) == 4 + 1  # 4 syllables, the 2nd shad


def test_syllable_starts_group_pieces_into_syllables(vocab: Vocabulary) -> None:
    for text in ["ཀ་ཁ་གང་ཅིད།", "སེམ་ཁུལ་མེན་མུས། ཏོར་པུར།", "ཀ་ཁང་གད། །ངར"]:
        ids = vocab.encode(text)
        starts = vocab.syllable_starts(ids)
        assert starts[0]
        units: list[str] = []
        for i, start in zip(ids, starts, strict=True):
            piece = vocab.id_to_piece(i).lstrip("\u2581")
            units.append(piece) if start or not units else units.__setitem__(-1, units[-1] + piece)
        # each unit holds at most one syllable (a lone shad after a space is its own unit)
        counts = [count_syllables(u) for u in units]
        assert max(counts) == 1 and sum(counts) == count_syllables(text), units
    assert vocab.syllable_starts([vocab.cls_id, vocab.sep_id]) == [True, True]
    # an unseen letter ([UNK]) stays inside its syllable: 4 syllables, 4 units
    ids = vocab.encode("བོད་ཀྱི་སྐད་ཡིག།")
    assert vocab.unk_id in ids
    assert sum(vocab.syllable_starts(ids)) == 4


def test_report_figures(built: tuple[Path, dict]) -> None:
    report = built[1]
    assert report["vocab_size"] == SIZE
    assert 0.0 <= report["unk_share"] < 0.01
    assert report["pieces_per_syllable"] >= 1.0
    assert 0.9 <= report["syllable_type_coverage"] <= 1.0
    assert 0.0 <= report["syllable_type_single_piece"] <= report["syllable_type_coverage"]
    longest = report["longest_pieces"]
    assert len(longest) == 20
    assert [len(p) for p in longest] == sorted((len(p) for p in longest), reverse=True)


def test_pickle_and_sha(vocab: Vocabulary, built: tuple[Path, dict]) -> None:
    clone = pickle.loads(pickle.dumps(vocab))
    assert clone.encode("ཀ་ཁ།") == vocab.encode("ཀ་ཁ།")
    assert vocab.sha256 == built[1]["sha256"] and len(vocab.sha256) == 64


def test_a_rebuild_gives_the_same_bytes(
    corpus: Path, built: tuple[Path, dict], tmp_path: Path
) -> None:
    # the rules file sits in a new temporary folder each build: its path must not reach the model
    report = build_vocabulary(corpus, tmp_path / "again", _config())
    first = (built[0] / "spm.model").read_bytes()
    assert (tmp_path / "again" / "spm.model").read_bytes() == first
    assert report["sha256"] == built[1]["sha256"]
    assert b"syllable_rules" not in first


def test_the_default_thread_count_is_the_same_on_every_machine(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Threads change SentencePiece's scores, so the default may not follow the core count."""
    import tibnlp.text.vocab_build as vb

    monkeypatch.setattr(vb.os, "cpu_count", lambda: 16)
    report = build_vocabulary(corpus, tmp_path / "v", VocabConfig(vocab_size=SIZE))
    assert report["num_threads"] == VocabConfig().num_threads == 2
    assert report["sentencepiece"] == __import__("sentencepiece").__version__
    report = build_vocabulary(corpus, tmp_path / "w", _config(num_threads=0))
    assert report["num_threads"] == 16  # 0 asks for one per core


def test_load_rejects_other_folders(tmp_path: Path, corpus: Path) -> None:
    with pytest.raises(DataError, match="not a tibnlp vocabulary"):
        Vocabulary.load(tmp_path)
    with pytest.raises(DataError, match="not a tibnlp vocabulary"):
        Vocabulary.load(corpus)
    # a bare SentencePiece folder: the message names only what it lacks
    (tmp_path / "spm.model").write_bytes(b"x")
    with pytest.raises(DataError, match=r"\(no tibnlp-vocab\.json\)"):
        Vocabulary.load(tmp_path)


def test_vocab_size_the_corpus_cannot_support(corpus: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"at most ~\d+ pieces") as info:
        build_vocabulary(corpus, tmp_path / "v", _config(vocab_size=200_000, hard_limit=True))
    assert "lower --vocab-size" in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_vocab_size_is_a_ceiling_by_default(corpus: Path, tmp_path: Path) -> None:
    report = build_vocabulary(corpus, tmp_path / "v", _config(vocab_size=200_000))
    assert report["requested_vocab_size"] == 200_000
    assert 16 < report["vocab_size"] < 200_000
    assert Vocabulary.load(tmp_path / "v").size == report["vocab_size"]


def test_empty_corpus(tmp_path: Path) -> None:
    empty = write_prepared(tmp_path / "empty", n_docs=5, heldout=1, empty=True)
    with pytest.raises(DataError, match="no sentences"):
        build_vocabulary(empty, tmp_path / "v", _config())
    assert not (tmp_path / "v").exists()


def test_not_a_prepared_corpus(tmp_path: Path) -> None:
    (tmp_path / "c").mkdir()
    with pytest.raises(DataError, match="not a prepared corpus"):
        build_vocabulary(tmp_path / "c", tmp_path / "v", _config())


def test_existing_output_is_refused(corpus: Path, built: tuple[Path, dict]) -> None:
    with pytest.raises(DataError, match="not empty"):
        build_vocabulary(corpus, built[0], _config())


def test_cli_reports_errors_without_traceback(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tibnlp.cli.main",
            "vocab",
            "build",
            "--corpus",
            str(tmp_path),
            "--output",
            str(tmp_path / "v"),
            "--vocab-size",
            "100",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode != 0
    message = " ".join(proc.stderr.split())  # rich wraps long lines
    assert "is not a prepared corpus" in message and "Traceback" not in message


def test_punctuation_pieces_stand_alone(corpus: Path, tmp_path: Path) -> None:
    """vocab.punctuation_pieces: a closing shad never glues onto its syllable (so a
    sentence-final syllable encodes as its mid-sentence twin), and the head marks are known
    even where the corpus never has them (this one has none)."""
    text = "ཀ་ཁ་གང།"
    cfg = _config(vocab_size=2000, punctuation_pieces=True, whole_units=True)
    build_vocabulary(corpus, tmp_path / "v", cfg)
    v = Vocabulary.load(tmp_path / "v")
    ids = v.encode(text)
    assert v.id_to_piece(ids[-1]) == "▁།"
    assert ids[:-1] == v.encode("ཀ་ཁ་གང")
    # with or without spaces around the shad, the next syllable opens with its `▁` piece: in
    # the model's own rules (`v.sp`, without our normaliser, which alone would equalise them)
    assert v.sp.encode("ཀ།ཁ") == v.sp.encode("ཀ། ཁ") == v.sp.encode("ཀ ། ཁ")
    assert v.encode("ཀ།ཁ")[-1] == v.encode("ཁ")[-1]
    head = [v.id_to_piece(i) for i in v.encode("༄༅། །ཀ་ཁ")]
    assert "[UNK]" not in head and {"༄", "༅", "▁།"} <= set(head)  # required characters
    assert v.syllable_starts(ids) == [True] * 4  # the shad is a unit of its own
    report = json.loads((tmp_path / "v" / "report.json").read_text())
    assert report["punctuation_pieces"] is True
    # decoding drops the space the rule put before a shad (not the tsheg after ང)
    assert v.punctuation_pieces
    assert v.decode(v.encode("ཀ་ཁ།ཀ་ང་།")) == "ཀ་ཁ། ཀ་ང་།"


def test_whole_units_make_every_repeated_syllable_one_piece(corpus: Path, tmp_path: Path) -> None:
    """vocab.whole_units: SentencePiece starts from every unit seen twice, so each of those
    syllables is one piece (its own seeds miss syllables only ever followed by another); the
    temporary seed file's path stays out of the model, so a rebuild gives the same bytes."""
    from collections import Counter

    from tibnlp.text.prepared import load_prepared
    from tibnlp.text.spm_units import unit_breaks
    from tibnlp.text.vocab_build import _sentences

    cfg = _config(vocab_size=2000, whole_units=True)  # a ceiling: the corpus supports fewer
    report = build_vocabulary(corpus, tmp_path / "v", cfg)
    v = Vocabulary.load(tmp_path / "v")
    train = _sentences(load_prepared(corpus)["train"])
    table = unit_breaks(cfg)
    units = Counter(u for sentence in train for u in sentence.translate(table).split())
    repeated = [u for u, c in units.items() if c >= 2]  # bare syllables and syllable + shad
    assert len(repeated) > 100
    assert all(len(v.encode(u)) == 1 and v.unk_id not in v.encode(u) for u in repeated)
    assert report["whole_units"] is True and report["syllable_type_single_piece"] > 0.5
    build_vocabulary(corpus, tmp_path / "again", cfg)
    assert Vocabulary.load(tmp_path / "again").sha256 == v.sha256


def test_unit_seeds_stop_at_the_longest_piece(tmp_path: Path) -> None:
    """A repeated unit without whitespace (a URL, an unspaced line) gives seeds no longer than
    SentencePiece keeps, not all its quadratically many substrings."""
    from tibnlp.text.spm_units import max_piece_length, unit_seeds

    long = "".join(chr(c) for c in range(0x0F40, 0x0F40 + 40))  # 40 distinct letters
    seeds = tmp_path / "seeds.tsv"
    n = unit_seeds(_config(), iter([long, long, "ཀ་ཁ"]), seeds)
    pieces = [line.split("\t")[0] for line in seeds.read_text(encoding="utf-8").splitlines()]
    assert n == len(pieces) and max(map(len, pieces)) == max_piece_length() == 16
    assert "▁" + long[:15] in pieces and long[:16] in pieces and long[:17] not in pieces


def test_cli_sets_and_shows_the_vocab_switches(corpus: Path, tmp_path: Path) -> None:
    """`--set vocab.whole_units=true` reaches the build, and the table says which switches
    built the vocabulary."""
    from typer.testing import CliRunner

    from tibnlp.cli.main import app

    args = ["vocab", "build", "--corpus", str(corpus), "--output", str(tmp_path / "v")]
    sets = ["--set", "vocab.whole_units=true", "--set", "vocab.num_threads=1"]
    result = CliRunner().invoke(app, [*args, "--vocab-size", "300", *sets])
    assert result.exit_code == 0, result.output
    shown = " ".join(result.output.replace("│", " ").split())
    assert "whole_units True" in shown and "punctuation_pieces False" in shown


def test_cross_syllables_pieces_span_syllables(corpus: Path, tmp_path: Path) -> None:
    """`vocab.cross_syllables`: frequent syllable runs become one piece (`▁ཀ▁ཁ`), the tsheg
    still reads as whitespace, the text round-trips, and a text of such a piece opens one
    masking unit per `▁`-piece (a multi-syllable piece is one unit)."""
    report = build_vocabulary(corpus, tmp_path / "v", _config(cross_syllables=True))
    v = Vocabulary.load(tmp_path / "v")
    pieces = [v.id_to_piece(i) for i in range(5, v.size)]
    crossing = [p for p in pieces if p.count("\u2581") > 1]
    assert crossing and report["multi_syllable_pieces"] == len(crossing)
    plain = build_vocabulary(corpus, tmp_path / "p", _config())
    assert report["cross_syllables"] and not plain["cross_syllables"]
    assert report["pieces_per_syllable"] < plain["pieces_per_syllable"]  # shorter sequences
    assert plain["multi_syllable_pieces"] == 0  # the default keeps pieces inside a syllable
    for piece in crossing:
        assert TSHEG not in piece  # the syllable rule still holds: tsheg -> whitespace
    best = max(crossing, key=lambda p: v.sp.get_score(v.piece_to_id(p)))
    text = TSHEG.join(best.split("\u2581")[1:])  # its syllables as written
    ids = v.encode(text)
    assert v.decode(ids) == text
    starts = v.syllable_starts(ids)
    assert best in [v.id_to_piece(i) for i in ids], [v.id_to_piece(i) for i in ids]
    assert len(ids) < count_syllables(text)
    assert sum(starts) == len([i for i in ids if v.id_to_piece(i).startswith("\u2581")])


def test_a_piece_across_a_word_boundary_joins_the_two_words(corpus: Path, tmp_path: Path) -> None:
    """Whole-word masking over a vocabulary whose pieces cross syllables: a piece `▁A▁B` where
    botok ends a word after A makes A's word and B's one masking group, so masking it never
    takes B's word in part; a word boundary after the piece keeps the words apart."""
    from tibnlp.data.words import SYLLABLE, WORD, piece_levels

    build_vocabulary(corpus, tmp_path / "v", _config(cross_syllables=True))
    v = Vocabulary.load(tmp_path / "v")
    singles = [p[1:] for p in map(v.id_to_piece, range(5, v.size)) if p.count("\u2581") == 1]
    crossing = [p for p in map(v.id_to_piece, range(5, v.size)) if p.count("\u2581") == 2]
    found = None
    for piece in crossing:
        a, b = piece.split("\u2581")[1:]
        for c in singles:
            text = f"{a}{TSHEG}{b}{TSHEG}{c}"
            pieces = [v.id_to_piece(i) for i in v.encode(text)]
            if pieces == [piece, "\u2581" + c]:
                found = a, b, c, text
                break
        if found:
            break
    assert found, "no crossing piece followed by a single-syllable piece in the test corpus"
    a, b, c, text = found
    inside = [0, len(f"{a}{TSHEG}".encode())]  # botok: "A་" | "B་C"
    after = [0, len(f"{a}{TSHEG}{b}{TSHEG}".encode())]  # botok: "A་B་" | "C"
    assert piece_levels(v, text, inside)[1] == [WORD, SYLLABLE]
    assert piece_levels(v, text, after)[1] == [WORD, WORD]


def test_a_digit_glued_to_a_syllable_joins_the_word_botok_cuts_after_it(vocab: Vocabulary) -> None:
    """ "༢༠༡༢ལོ" is one syllable (digits glued to letters), which botok cuts after the digits.
    Where its word runs on past the syllable ("ལོ་ཟླ་བ"), the next syllable joins the digits'
    masking group; where botok ends that word after "ལོ", the next syllable opens its own."""
    from tibnlp.data.words import SYLLABLE, WORD, piece_levels

    text = f"༢༠༡༢ལོ{TSHEG}ཟླ{TSHEG}བ"
    ids = vocab.encode(text)
    heads = [i for i, s in enumerate(vocab.syllable_starts(ids)) if s]
    assert len(heads) == 3, [vocab.id_to_piece(i) for i in ids]
    digits = len("༢༠༡༢".encode())
    runs_on = piece_levels(vocab, text, [0, digits])[1]
    assert [runs_on[h] for h in heads] == [WORD, SYLLABLE, SYLLABLE]
    ends = piece_levels(vocab, text, [0, digits, len(f"༢༠༡༢ལོ{TSHEG}".encode())])[1]
    assert [ends[h] for h in heads] == [WORD, WORD, SYLLABLE]


@pytest.mark.parametrize(
    ("switches", "needs"),
    [({"split_on_tsheg": False}, "needs split_on_tsheg"), ({"whole_units": True}, "whole_units")],
)
def test_cross_syllables_refuses_what_it_cannot_combine_with(
    switches: dict[str, bool], needs: str
) -> None:
    from tibnlp.errors import ConfigError

    config = _config(cross_syllables=True, **switches)
    with pytest.raises(ConfigError, match=rf"vocab\.cross_syllables.*{needs}"):
        config.validate("vocab")
