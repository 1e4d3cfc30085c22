"""Whole-word masking: botok words found at preparation time, aligned to pieces, masked whole.

Runs botok with the dialect pack from the data directory on real Tibetan text: a few sentences
written out here, and a slice of the shared news and literature corpora (the experiments'
corpus) prepared with `corpus.words`, with a vocabulary trained on it (pieces are whole
syllables, as in real use). Skips with the reason when botok, the pack or the corpora are
absent.
"""

from __future__ import annotations

import contextlib
import json
import lzma
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from processes import slow_start
from tibetan_fixtures import save_prepared

from tibnlp.config import CorpusConfig, VocabConfig, load_config
from tibnlp.data.masking import IGNORE_INDEX, MlmCollator
from tibnlp.data.pretraining import build_pretraining_dataset, load_pretraining_dataset
from tibnlp.data.words import WORD, piece_levels
from tibnlp.errors import ConfigError, DataError
from tibnlp.text import corpus_words, word_shards
from tibnlp.text.corpus_words import load_words, segment_corpus
from tibnlp.text.prepare import load_prepared, prepare_corpus
from tibnlp.text.vocab import Vocabulary
from tibnlp.text.vocab_build import build_vocabulary
from tibnlp.text.words import WordSegmenter, require_pack

SEQ_LEN = 48  # short, so long sentences are cut (at word boundaries) as well
SEEDS = 200
SLICE = {"tibetan_tibettimes_news.txt.xz": 24, "tibetan_tibetcm_literature.txt.xz": 4}  # docs
# Real sentences of the shared corpora (tibettimes news, tibetcm literature), with numbers.
SENTENCES = [
    "སི་ཁྲོན་ཞིང་ཆེན་སྲིད་གྲོས་ཀྱི་མགོ་ཁྲིད་ལི་ཁྲོང་ཞི་ལ་ཁྲིམས་འགལ་གྱི་དོགས་གཞིའི་འོག་ཞིབ་བཤེར་བྱེད་བཞིན་ཡོད་འདུག",
    "ཟླ་སྔོན་མའི་ཚེས་ ༢༩ རྒྱ་ནག་དབུས་སྒྲིག་ཁྲིམས་ཞིབ་བཤེར་ཨུ་ཡོན་ལྷན་ཁང་གི་དྲ་བའི་ཐོག་གནས་ཚུལ་སྤེལ་བ་ལྟར་ན།",
    "རྒྱ་རིཊ་ཆབ་སྲིད་དཔྱད་བརྗོད་པ་ཁྲིན་ཕོ་ཁུང་ལཊ་ཀྱིས་བོད་མི་ཚོར་གཏམ་བཤད་གནང་སྟེ།",
    "བོད་རང་བཙན་སྤྱི་ཚོཊ་ཀྱི་སྐད་སྒྲ་གཙོ་བོར་གྱུར་ཚེ།",
    "དེ་རིང་པེན་བོད་ཀྱི་རྩོམ་པ་པོའི་མཐུན་ཚོགས་ཀྱིས་རྒྱལ་སྤྱིའི་བུད་མེད་དུས་ཆེན་ཐེངས་ ༡༠༥ "
    "པ་སྲུང་གཙིའི་ཐོག་བོད་ཀྱི་སྐྱེས་མ་ཚོར་དམིགས་བསལ་ཀྱི་འཇོན་ཐང་དང་ནུས་པ་ཡོད་སྐོར་བརྗོད་སོང་།",
    "དེ་རིང་སྔ་དྲོའི་ཆུ་ཚོད་ ༡༠ བའི་སྟེང་བཞུགས་སྒར་དྷ་སའི་ཉེ་འགྲམ་གྱི་བཙུན་དགོན་སྒྲོལ་མ་གླིང་གི་ཚོགས་ཁང་དུ།",
    "ཏག་ཏག་ང་རང་ཕ་ཡུལ་ནས་ཡོང་ཁར།",
    "༡ ཁྱོད་ཀྱིས་དུས་ནམ་ཞིག་ནས་སྙན་ངག་འབྲི་མགོ་བརྩམས་པ་ཡིན།",
]


def _need_botok() -> Path:
    pytest.importorskip("botok", reason="whole-word masking needs the botok package")
    try:
        return require_pack()
    except DataError as exc:
        pytest.skip(f"needs the botok dialect pack: {exc}")


def write_corpus(path: Path, n_docs: int = 24, heldout: int = 4) -> Path:
    """A prepared corpus (the `tibnlp corpus prepare` layout) of the real sentences."""
    rng = random.Random(0)
    docs = [
        {"doc_id": i, "source": "real", "sentences": rng.choices(SENTENCES, k=rng.randint(2, 7))}
        for i in range(n_docs)
    ]
    return save_prepared(path, docs, heldout, {"documents": n_docs})


def write_slice(corpora: Path, out: Path) -> Path:
    """The first documents (blank-line separated) of each corpus file of `SLICE`."""
    with out.open("w", encoding="utf-8") as fh:
        for name, docs in SLICE.items():
            with lzma.open(corpora / name, "rt", encoding="utf-8") as src:
                for line in src:
                    docs -= not line.strip()
                    if docs < 0:
                        break
                    fh.write(line)
            fh.write("\n")
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict:
    from tibnlp.data.datadir import data_dir

    pack = _need_botok()
    corpora = data_dir() / "corpora"
    if not all((corpora / name).is_file() for name in SLICE):
        pytest.skip(f"needs {', '.join(SLICE)} in {corpora}; run `tibnlp data link SOURCE_DIR`")
    root = tmp_path_factory.mktemp("wwm")
    cache = root / "cache"
    text = write_slice(corpora, root / "slice.txt")
    cfg = CorpusConfig(num_proc=1, heldout_fraction=0.1, words=True)
    prepare_corpus([text], root / "corpus", cfg, progress=False)
    corpus = root / "corpus"
    build_vocabulary(corpus, root / "vocab", VocabConfig(vocab_size=8000, num_threads=1))
    vocab = Vocabulary.load(root / "vocab")
    meta = segment_corpus(corpus, 1, pack=pack, cache=cache, progress=None)  # up to date
    data = build_pretraining_dataset(
        corpus, vocab, SEQ_LEN, root / "data", num_proc=1, masking="whole_word"
    )
    ds, _ = load_pretraining_dataset(data)
    segmenter = WordSegmenter(pack, cache)
    return {
        "root": root,
        "pack": pack,
        "cache": cache,
        "corpus": corpus,
        "vocab": vocab,
        "meta": meta,
        "examples": [ds["train"][i] for i in range(len(ds["train"]))],
        "segmenter": segmenter,
    }


def _word_groups(word_start: list[bool], special: list[bool]) -> list[list[int]]:
    groups: list[list[int]] = []
    for pos, (start, sp) in enumerate(zip(word_start, special, strict=True)):
        if sp:
            continue
        if start or not groups:
            groups.append([pos])
        else:
            groups[-1].append(pos)
    return groups


def test_pieces_of_one_botok_word_share_one_word(setup: dict) -> None:
    """Adjacent letter-bearing pieces are in the same word exactly when botok put their
    letters in the same token: words are botok's, and units never straddle them."""
    vocab, seg = setup["vocab"], setup["segmenter"]
    checked = 0
    for sentence in SENTENCES:
        starts = seg.starts(sentence)
        ids, levels = piece_levels(vocab, sentence, starts)
        assert levels[0] == WORD and len(ids) == len(vocab.encode(sentence))
        assert ids == vocab.encode(sentence)
        pieces = vocab.sp.encode(sentence, return_type="proto").pieces
        word = token = -1
        previous: tuple[int, int] | None = None
        for piece, level in zip(pieces, levels, strict=True):
            word += level == WORD
            body = piece.surface.lstrip(" \u0f0b")
            if not body or not body[0].isalpha():  # separators, shad, digits
                continue
            anchor = piece.begin + len(piece.surface[: len(piece.surface) - len(body)].encode())
            token = sum(1 for s in starts if s <= anchor) - 1
            if previous is not None:
                assert (previous[0] == word) == (previous[1] == token), sentence
                checked += 1
            previous = (word, token)
    assert checked > 100


def test_examples_carry_word_starts(setup: dict) -> None:
    vocab = setup["vocab"]
    multi = 0
    for ex in setup["examples"]:
        assert ex["length"] <= SEQ_LEN
        words, syllables = ex["word_start"], ex["syllable_start"]
        assert len(words) == len(ex["input_ids"])
        assert all(s for w, s in zip(words, syllables, strict=True) if w)  # words ⊆ syllables
        sep = ex["input_ids"].index(vocab.sep_id)
        assert words[1] and words[sep + 1]  # A and B both start on a word
        multi += sum(syllables) > sum(words)
    assert multi > len(setup["examples"]) // 2  # most examples hold multi-syllable words


def _masked(setup: dict, seed: int, whole_word: bool, batch_index: int = 0) -> tuple:
    rng = random.Random(seed)
    examples = rng.sample(setup["examples"], 8)
    collator = MlmCollator(setup["vocab"], 0.15, 3, seed, whole_word=whole_word)
    return examples, collator(examples, batch_index)


def test_whole_word_masks_never_split_a_word(setup: dict) -> None:
    special_ids = setup["vocab"].special_ids
    whole = partial = 0
    for seed in range(SEEDS):
        examples, batch = _masked(setup, seed, True, batch_index=seed % 7)
        labels = batch["mlm_labels"]
        for row, ex in enumerate(examples):
            special = [i in special_ids for i in ex["input_ids"]]
            for group in _word_groups(ex["word_start"], special):
                chosen = [bool(labels[row, p] != IGNORE_INDEX) for p in group]
                assert all(chosen) or not any(chosen), (seed, row, group)
                if all(chosen):
                    whole += len(group) > 1
    # and span masking (syllables) does cut multi-piece words: the test can see a split
    for seed in range(SEEDS):
        examples, batch = _masked(setup, seed, False)
        for row, ex in enumerate(examples):
            special = [i in special_ids for i in ex["input_ids"]]
            for group in _word_groups(ex["word_start"], special):
                chosen = {bool(batch["mlm_labels"][row, p] != IGNORE_INDEX) for p in group}
                partial += len(chosen) == 2
    assert whole > 100 and partial > 10


def test_mask_rate_is_kept_in_pieces(setup: dict) -> None:
    special_ids = setup["vocab"].special_ids
    for whole_word in (True, False):
        masked = real = 0
        for seed in range(SEEDS):
            examples, batch = _masked(setup, seed, whole_word)
            masked += int((batch["mlm_labels"] != IGNORE_INDEX).sum())
            real += sum(i not in special_ids for ex in examples for i in ex["input_ids"])
        assert masked / real == pytest.approx(0.15, abs=0.01), whole_word


def test_masking_is_a_function_of_seed_and_batch_index(setup: dict) -> None:
    """What resume relies on: a fresh collator reproduces a batch from (seed, index)."""
    examples, first = _masked(setup, 5, True, batch_index=3)
    again = MlmCollator(setup["vocab"], 0.15, 3, 5, whole_word=True)(examples, 3)
    for key in first:
        assert torch.equal(first[key], again[key]), key
    other = MlmCollator(setup["vocab"], 0.15, 3, 5, whole_word=True)(examples, 4)
    assert not torch.equal(first["mlm_labels"], other["mlm_labels"])


def test_whole_word_collator_needs_word_starts(setup: dict) -> None:
    example = {k: v for k, v in setup["examples"][0].items() if k != "word_start"}
    with pytest.raises(DataError, match="word_start"):
        MlmCollator(setup["vocab"], whole_word=True)([example], 0)


def test_span_datasets_are_unchanged_and_cached_apart(setup: dict) -> None:
    root, vocab, corpus = setup["root"], setup["vocab"], setup["corpus"]
    span = build_pretraining_dataset(corpus, vocab, SEQ_LEN, root / "span", num_proc=1)
    ds, meta = load_pretraining_dataset(span)
    assert "word_start" not in ds["train"].column_names and "masking" not in meta
    whole = json.loads((root / "data" / "meta.json").read_text())
    assert whole["masking"] == "whole_word" and whole["words"] == setup["meta"]["key"]
    assert whole["cache_key"] != meta["cache_key"]
    with pytest.raises(DataError, match="other inputs"):
        build_pretraining_dataset(corpus, vocab, SEQ_LEN, span, num_proc=1, masking="whole_word")
    with pytest.raises(DataError, match="masking 'word'"):
        build_pretraining_dataset(corpus, vocab, SEQ_LEN, root / "x", masking="word")


def test_words_are_stored_with_the_corpus(setup: dict) -> None:
    corpus, meta = setup["corpus"], setup["meta"]
    words, loaded = load_words(corpus, load_prepared(corpus))
    assert meta["kept"] and loaded == {k: v for k, v in meta.items() if k != "kept"}
    run = json.loads((corpus / "words" / corpus_words.RUN_FILE).read_text())
    assert run["num_proc"] == 1 and run["resumed_shards"] == 0 and run["cpu_seconds"] > 0
    assert meta["syllables"] > meta["words"] > 0
    first = load_prepared(corpus)["train"][0]["sentences"]
    stored = words["train"][0]["word_starts"]
    assert stored == [setup["segmenter"].starts(s) for s in first]
    stamp = (corpus / "words" / "meta.json").stat().st_mtime_ns
    assert segment_corpus(corpus, 1, pack=setup["pack"], cache=setup["cache"], progress=None)
    assert (corpus / "words" / "meta.json").stat().st_mtime_ns == stamp  # up to date: kept


def test_segmentation_resumes_after_an_interruption(
    setup: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = shutil.copytree(setup["corpus"], setup["root"] / "resumed", ignore=_no_words)
    monkeypatch.setattr(word_shards, "SHARD_CHARS", 600)  # several shards

    class Interrupted(Exception):
        pass

    def stop_after_first_shard(line: str) -> None:
        if "shard 1/" in line:
            raise Interrupted

    with pytest.raises(Interrupted):
        segment_corpus(corpus, 1, setup["pack"], setup["cache"], stop_after_first_shard)
    assert not (corpus / "words").exists()
    assert len(list((corpus / ".words.partial").glob("*.npz"))) >= 1
    lines: list[str] = []
    meta = segment_corpus(corpus, 1, setup["pack"], setup["cache"], lines.append)
    assert meta["resumed_shards"] >= 1 and meta["shards"] > meta["resumed_shards"]
    assert not (corpus / ".words.partial").exists()
    assert any("ETA" in line for line in lines)
    a = load_words(corpus, load_prepared(corpus))[0]
    b = load_words(setup["corpus"], load_prepared(setup["corpus"]))[0]
    assert all(a[s]["word_starts"] == b[s]["word_starts"] for s in ("train", "heldout"))


def test_the_same_corpus_gives_the_same_words_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """words/meta.json held the seconds taken, num_proc, the resumed shards and the pack's
    absolute path: two identical preparations with words differed, so a pipeline given the
    corpus folder (`path_hash`) ran everything after it again. Those go to the hidden run
    file; every other file under words/ is the same bytes, whatever the process count or the
    pack's folder."""
    from tibnlp.tracking.conventions import path_hash

    pack = _need_botok()
    monkeypatch.setattr(word_shards, "SHARD_CHARS", 600)  # several shards, for 2 processes
    one = write_corpus(tmp_path / "one", n_docs=8, heldout=2)
    two = shutil.copytree(one, tmp_path / "two")
    moved = shutil.copytree(pack, tmp_path / "moved" / "general")  # the same pack elsewhere
    made = [
        segment_corpus(one, 1, pack=pack, progress=None),
        segment_corpus(two, 2, pack=moved, progress=None),
    ]
    assert [m["num_proc"] for m in made] == [1, 2] and made[1]["shards"] > 2

    def visible(corpus: Path) -> dict[str, bytes]:
        words = corpus / "words"
        files = [f for f in words.rglob("*") if f.is_file()]
        return {
            f.relative_to(words).as_posix(): f.read_bytes()
            for f in files
            if not any(part.startswith(".") for part in f.relative_to(words).parts)
        }

    files = visible(one)
    assert {"meta.json", "train/state.json", "heldout/state.json"} <= set(files)
    for name, content in files.items():
        assert visible(two)[name] == content, name
    assert set(visible(two)) == set(files)
    assert path_hash(one / "words") == path_hash(two / "words")
    assert path_hash(one) == path_hash(two)
    assert not made[0]["kept"] and made[0]["key"] == made[1]["key"]
    runs = [json.loads((c / "words" / corpus_words.RUN_FILE).read_text()) for c in (one, two)]
    assert runs[0]["num_proc"] == 1 and runs[1]["pack"] == str(moved)  # the run facts stay
    meta = json.loads(files["meta.json"])
    assert not {"pack", "num_proc", "wall_seconds", "resumed_shards", "cpu_seconds"} & set(meta)


def _words_command(corpus: Path, pack: Path) -> tuple[int, str]:
    """`tibnlp corpus words CORPUS` on one process: exit status and output, unwrapped."""
    from typer.testing import CliRunner

    from tibnlp.cli.main import app

    args = ["corpus", "words", str(corpus), "--num-proc", "1", "--pack", str(pack)]
    result = CliRunner().invoke(app, args)
    return result.exit_code, " ".join(result.output.split())


def test_words_up_to_date_are_said_to_be_kept(tmp_path: Path) -> None:
    """Run again on words that were up to date, `corpus words` said "segmented in 16 s, ...
    syllables/s" (the first run's seconds, with a rate) as if it had done the work."""
    pack = _need_botok()
    corpus = write_corpus(tmp_path / "corpus", n_docs=4, heldout=1)
    code, out = _words_command(corpus, pack)
    assert code == 0 and "segmented in" in out and "syllables/s" in out, out
    stamp = (corpus / "words" / "meta.json").stat().st_mtime_ns
    code, out = _words_command(corpus, pack)
    assert code == 0 and "is up to date, kept:" in out, out
    assert "segmented" not in out and "syllables/s" not in out, out
    assert (corpus / "words" / "meta.json").stat().st_mtime_ns == stamp


def test_words_found_before_the_run_file_are_moved_to_todays_layout(tmp_path: Path) -> None:
    """Words found before the run file existed have the same key, and meta.json held the run
    facts (seconds, num_proc, the pack's path): kept as "up to date" for good, that folder
    never hashed as the same words found anew. The facts move to the run file once, the
    words are kept, and meta.json is then the bytes a new `corpus words` writes."""
    from tibnlp.tracking.conventions import path_hash

    pack = _need_botok()
    corpus = write_corpus(tmp_path / "corpus", n_docs=4, heldout=1)
    assert _words_command(corpus, pack)[0] == 0
    words = corpus / "words"
    fresh, hashed = (words / "meta.json").read_bytes(), path_hash(corpus)
    meta = json.loads(fresh)
    run = {"pack": str(pack), "num_proc": 1, "wall_seconds": 3.2, "shards": 1}
    run |= {"resumed_shards": 0, "shard_seconds": 2.9, "cpu_seconds": 2.8}
    old = {k: meta[k] for k in ("key", "corpus")} | {"pack": run["pack"]}  # the old order
    old |= {k: meta[k] for k in ("pack_sha256", "botok", "split_affixes")}
    old |= {k: run[k] for k in ("num_proc", "wall_seconds", "shards", "resumed_shards")}
    old |= {k: meta[k] for k in ("characters", "syllables", "words")}
    old |= {k: run[k] for k in ("shard_seconds", "cpu_seconds")}
    (words / "meta.json").write_text(json.dumps(old, indent=2) + "\n", encoding="utf-8")
    (words / corpus_words.RUN_FILE).unlink()
    assert path_hash(corpus) != hashed  # (as an old folder differs from a new one)
    splits = {s: (words / s / "state.json").stat().st_mtime_ns for s in ("train", "heldout")}
    code, out = _words_command(corpus, pack)
    assert code == 0 and "is up to date, kept:" in out and "segmented" not in out, out
    assert "moved there" in out and "meta.json held how it was made" in out, out
    assert (words / "meta.json").read_bytes() == fresh
    assert json.loads((words / corpus_words.RUN_FILE).read_text()) == run
    assert path_hash(corpus) == hashed
    assert {s: (words / s / "state.json").stat().st_mtime_ns for s in splits} == splits
    code, out = _words_command(corpus, pack)  # moved once
    assert code == 0 and "is up to date, kept:" in out and "moved" not in out, out


def test_an_interrupted_words_command_says_how_to_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interrupted, `corpus words` exited 130 saying nothing of the shards it keeps, though
    the same command resumes from them (other commands say so: "run the same command
    again")."""
    from tibnlp.cli import corpus as corpus_cli

    pack = _need_botok()
    monkeypatch.setattr(word_shards, "SHARD_CHARS", 600)  # several shards
    corpus = write_corpus(tmp_path / "corpus", n_docs=6, heldout=1)
    segment = corpus_cli.segment_corpus

    def stop_after_first_shard(line: str) -> None:  # a Ctrl-C as the first shard is done
        if "shard 1/" in line:
            raise KeyboardInterrupt

    def interrupted(*args: object, **kwargs: object) -> dict:
        return segment(*args, **{**kwargs, "progress": stop_after_first_shard})

    monkeypatch.setattr(corpus_cli, "segment_corpus", interrupted)
    code, out = _words_command(corpus, pack)
    said = re.search(r"interrupted: the (\d+) finished shard\(s\) stay in (\S+);", out)
    assert code == 130 and said, out
    assert "run the same command again to resume from them" in out, out
    assert said[2].endswith(".words.partial") and not (corpus / "words").exists()
    monkeypatch.setattr(corpus_cli, "segment_corpus", segment)
    code, out = _words_command(corpus, pack)
    assert code == 0 and "segmented in" in out, out
    run = json.loads((corpus / "words" / corpus_words.RUN_FILE).read_text())
    assert run["resumed_shards"] == int(said[1]) >= 1  # what it said stays is what resumed


def test_a_words_command_interrupted_before_any_shard_names_no_shards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interrupted before a shard was done, it said "the 0 finished shard(s) stay in
    .../.words.partial; ... resume from them", naming a folder that may not exist."""
    from tibnlp.cli import corpus as corpus_cli

    def at_once(*args: object, **kwargs: object) -> dict:
        raise KeyboardInterrupt

    monkeypatch.setattr(corpus_cli, "segment_corpus", at_once)
    code, out = _words_command(write_corpus(tmp_path / "corpus", n_docs=4, heldout=1), tmp_path)
    assert code == 130, out
    assert "interrupted before any shard was finished: run the same command again" in out, out
    assert "stay in" not in out, out


# `tibnlp corpus words` with small shards, each after the first taking long enough for a Ctrl-C
# to find its worker at work; a worker the Ctrl-C interrupts leaves a mark
SLOW_WORDS = """
import sys, time
from pathlib import Path
from tibnlp.text import word_shards

word_shards.SHARD_CHARS = 600
real = word_shards._segment_shard
mark = Path(sys.argv[1]) / "worker-interrupted"

def slow(job):
    if (job[0], job[1]) != ("train", 0):
        try:
            end = time.monotonic() + 60
            while time.monotonic() < end:  # at work in Python, as botok is
                pass
        except KeyboardInterrupt:
            mark.touch()
            raise
    return real(job)

word_shards._segment_shard = slow
from tibnlp.cli.main import main
sys.argv = ["tibnlp", "corpus", "words", sys.argv[1], "--num-proc", "1", "--pack", sys.argv[2]]
main()
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "killed"])
def test_a_stopped_words_command_leaves_no_worker_and_no_traceback(
    tmp_path: Path, sig: int
) -> None:
    """A real Ctrl-C (SIGINT to the process group, as a terminal sends it): the command exits
    130 with the line on what stays; each pool worker took the SIGINT too and printed a
    KeyboardInterrupt traceback, burying that line. A parent killed outright (SIGKILL, the
    OOM killer) does not end its pool: its workers segmented on, then waited forever on the
    task queue, out of a Ctrl-C's reach."""
    from processes import gone

    pack = _need_botok()
    corpus = write_corpus(tmp_path / "corpus", n_docs=6, heldout=1)
    log = tmp_path / "log.txt"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env["PYTHONUNBUFFERED"] = "1"  # a worker's traceback is in the log before it is ended
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", SLOW_WORDS, str(corpus), str(pack)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a group of its own, as a shell's job
        )
    try:
        deadline = time.monotonic() + 120
        while "shard 1/" not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        workers = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        assert workers, "the pool's worker"
        if sig == signal.SIGKILL:
            proc.kill()
        else:
            os.killpg(proc.pid, sig)
        proc.wait(timeout=60)
        assert all(gone(int(pid)) for pid in workers)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    if sig == signal.SIGKILL:
        return
    text = " ".join(log.read_text(errors="replace").split())
    assert proc.returncode == 130, text[-3000:]
    assert "interrupted: the 1 finished shard(s) stay in" in text, text[-3000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    assert not (corpus / "worker-interrupted").exists()  # the Ctrl-C was the parent's alone


# `tibnlp corpus words` on two processes whose workers take their time to start
# (`processes.slow_start`: before the pool's initializer)
STARTING_WORDS = (
    slow_start("tibnlp.text.word_shards", "_init_worker", "sys.argv[3]")
    + """
from tibnlp.text import word_shards
from tibnlp.cli.main import main

word_shards.SHARD_CHARS = 600
sys.argv = ["tibnlp", "corpus", "words", sys.argv[1], "--num-proc", "2", "--pack", sys.argv[2]]
main()
"""
)


def test_a_ctrl_c_as_the_words_workers_start_stops_cleanly(tmp_path: Path) -> None:
    """A Ctrl-C (SIGINT to the process group) that reached a pool worker before its
    initializer ignored SIGINT raised KeyboardInterrupt there, and each such worker printed
    "Process ForkPoolWorker-N: Traceback ... KeyboardInterrupt" over the command's line."""
    from processes import alive, stop_at_two_workers

    pack = _need_botok()
    corpus = write_corpus(tmp_path / "corpus", n_docs=6, heldout=1)
    marks = tmp_path / "marks"
    marks.mkdir()
    root = Path(__file__).resolve().parents[1]
    args = [str(corpus), str(pack), str(marks)]
    code, text, workers = stop_at_two_workers(STARTING_WORDS, args, marks, signal.SIGINT, root)
    text = " ".join(text.split())
    assert code == 130, text[-3000:]
    assert "interrupted before any shard was finished: run the same command again" in text, text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    assert not any(alive(pid) for pid in workers)
    assert not (tmp_path / "worker-interrupted").exists()  # the Ctrl-C was the parent's alone
    assert not (corpus / "words").exists()


def _no_words(directory: str, names: list[str]) -> list[str]:
    return [n for n in names if n in ("words", ".words.partial")]


def test_a_read_only_pack_is_never_written(setup: dict, tmp_path: Path) -> None:
    pack = shutil.copytree(setup["pack"], tmp_path / "ro" / "general")
    before = sorted(p.relative_to(pack) for p in pack.rglob("*"))
    for p in [pack, *pack.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    try:
        seg = WordSegmenter(pack, tmp_path / "cache")
        assert seg.starts(SENTENCES[6]) == setup["segmenter"].starts(SENTENCES[6])
        assert sorted(p.relative_to(pack) for p in pack.rglob("*")) == before
        assert list((tmp_path / "cache" / "botok").glob("*/general_trie.pickled"))
    finally:
        for p in [pack, *pack.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)


def test_missing_pack_and_missing_words_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"botok dialect pack not found: .*nowhere"):
        require_pack(tmp_path / "nowhere")
    corpus = write_corpus(tmp_path / "corpus", n_docs=4, heldout=1)
    with pytest.raises(DataError, match="nowhere") as info:
        segment_corpus(corpus, 1, pack=tmp_path / "nowhere", progress=None)
    assert "never downloaded" in str(info.value)
    with pytest.raises(DataError, match="no botok words") as info:
        load_words(corpus, load_prepared(corpus))
    assert "tibnlp corpus words" in str(info.value)


def test_a_pack_parent_given_to_pack_names_the_pack_inside(tmp_path: Path) -> None:
    """`--pack botok` (the shared data's folder that holds general/) was answered with "link
    the shared data with `tibnlp data link`", a hint about the data directory, which --pack
    had not used."""
    (tmp_path / "botok" / "general" / "dictionary").mkdir(parents=True)
    with pytest.raises(DataError) as info:
        require_pack(tmp_path / "botok")
    assert info.value.hint == f"{tmp_path / 'botok'} holds the dialect pack " + (
        f"{tmp_path / 'botok' / 'general'}: give that folder"
    )
    with pytest.raises(DataError) as info:  # nothing below: the pack's own folder is asked
        require_pack(tmp_path / "nowhere")
    assert "data link" not in str(info.value.hint) and "dictionary/" in str(info.value.hint)


def test_masking_key_is_validated() -> None:
    assert load_config(None, ["pretrain.masking=whole_word"]).pretrain.masking == "whole_word"
    with pytest.raises(ConfigError, match=r"pretrain\.masking"):
        load_config(None, ["pretrain.masking=word"])


def test_data_link_links_the_botok_pack(tmp_path: Path) -> None:
    """`tibnlp data link SOURCE` links every manifest's folder, the botok pack's included."""
    from tibnlp.data.datadir import link_into
    from tibnlp.data.manifests import all_manifests

    manifest = all_manifests()["botok"]
    assert manifest.kind == "resource" and manifest.root == "botok"
    (tmp_path / "shared" / "botok" / "general" / "dictionary").mkdir(parents=True)
    roots = {m.root for m in all_manifests().values()}
    linked = link_into(tmp_path / "shared", names=roots, target=tmp_path / "data").linked
    assert linked == ["botok"]
    assert require_pack(tmp_path / "data" / "botok" / "general").is_dir()


def test_the_shared_pack_matches_its_manifest() -> None:
    from tibnlp.data.manifests import all_manifests

    manifest = all_manifests()["botok"]
    if not manifest.path.exists():
        pytest.skip(f"the botok pack is not in the data directory ({manifest.path})")
    assert manifest.status() == "present"
