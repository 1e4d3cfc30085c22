"""The benchmark scripts behind benchmarks/results/ still run: each at a toy size, writing its
table, so a measured result stays "a command in the repo that anyone can re-run" while the
package changes under it. Nothing here asserts a time or a speed ratio (machine load moves
them): only that the rows exist and their numbers are finite.

A script that runs each variant in a fresh interpreter (`python SCRIPT --worker ...`) has its
worker commands run in this process instead (`in_process`): seconds of imports per worker
would dominate the file, and the commands and the JSON they print are still the script's."""

from __future__ import annotations

import contextlib
import io
import json
import lzma
import math
import random
import runpy
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tests.ft_fixtures import make_data_dir, make_model_dir, make_vocab
from tests.tibetan_fixtures import (
    TINY_MODEL,
    prepared_inputs,
    sentence,
    syllable,
    write_prepared,
)

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str) -> dict[str, Any]:
    return runpy.run_path(str(BENCH / f"{name}.py"))


def run_main(script: dict[str, Any], argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", [script["__file__"], *argv])
    script["main"]()


def in_process(script: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Route the script's `subprocess.run([python, SCRIPT, ...])` to its own `main` in this
    process, stdout captured as the child's; returns the commands run."""
    calls: list[list[str]] = []

    def run(cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        assert Path(cmd[1]) == Path(script["__file__"]), cmd
        calls.append(cmd)
        out = io.StringIO()
        with monkeypatch.context() as m, contextlib.redirect_stdout(out):
            m.setattr(sys, "argv", cmd[1:])
            script["main"]()
        return subprocess.CompletedProcess(cmd, 0, out.getvalue(), "")

    monkeypatch.setitem(script["main"].__globals__, "subprocess", SimpleNamespace(run=run))
    return calls


def table(text: str, header: str) -> list[list[str]]:
    """The body rows (cells) of the markdown table whose header row starts with `header`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def number(cell: str) -> float:
    """A table cell's number: `1,234`, `0.82`, `1.48x`, `12.5%` -> float (finite or not)."""
    return float(cell.replace(",", "").rstrip("x%").strip())


def finite(cells: list[str]) -> bool:
    return all(math.isfinite(number(c)) for c in cells)


@pytest.fixture(autouse=True)
def _threads_as_they_were():
    """The scripts set torch's thread count for their measurement: put the suite's back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_bench_attention_times_every_variant_at_a_toy_shape(tmp_path, monkeypatch) -> None:
    out = tmp_path / "attention.md"
    run_main(
        load("bench_attention"),
        ["--rounds", "1", "--shapes", "8:2", "--out", str(out)],
        monkeypatch,
    )
    text = out.read_text()
    assert "--shapes 8:2`" in text  # the command that wrote it
    rows = table(text, "| N | batch | part |")
    assert {(r[2], r[3]) for r in rows} >= {
        ("core", "multi-scale h=12"),
        ("layer", "multi-scale h=12, FFN-free"),
        ("attention", "dynamic (8,12) sentence rule, mixed"),
    }
    assert len(rows) == 13 and all(r[:2] == ["8", "2"] and finite(r[4:]) for r in rows)
    with pytest.raises(SystemExit):
        run_main(load("bench_attention"), ["--shapes", "8x2"], monkeypatch)


def test_bench_designs_runs_its_workers_and_tables_every_variant(tmp_path, monkeypatch) -> None:
    script = load("bench_designs")
    shape = ["--batch", "2", "--seq", "8", "--vocab", "60"]
    # every variant's worker at the toy shape, then the table from two of them
    for name in script["variants"](8):
        result = script["worker"](name, 1, 2, 8, 60)
        assert result["tokens_per_cpu_s"] > 0 and math.isfinite(result["peak_mib"]), name
    calls = in_process(script, monkeypatch)
    out = tmp_path / "designs.md"
    chosen = "base (absolute, dense);relative + recurrence (2 segments, mem 8)"
    argv = ["--rounds", "1", "--steps", "1", *shape, "--variants", chosen, "--out", str(out)]
    run_main(script, argv, monkeypatch)
    assert [c[3] for c in calls] == chosen.split(";") and all(c[-6:] == shape for c in calls)
    rows = table(out.read_text(), "| variant | tokens / CPU-s |")
    assert [r[0] for r in rows] == chosen.split(";")
    assert rows[0][3] == "1.00"  # the first variant named is the ratios' reference
    assert all(finite([r[1], r[3], r[4], r[5]]) for r in rows)
    with pytest.raises(SystemExit):
        run_main(script, ["--variants", "no such design"], monkeypatch)


def test_bench_prepare_tables_both_process_counts(tmp_path, monkeypatch) -> None:
    rng = random.Random(0)
    words = ["་".join(syllable(rng) for _ in range(2)) for _ in range(100)]
    docs = ["\n".join(sentence(rng, words) for _ in range(4)) for _ in range(40)]
    raw = tmp_path / "tiny.txt.xz"
    raw.write_bytes(lzma.compress("\n\n".join(docs).encode()))
    out = tmp_path / "prepare.md"
    argv = ["--procs", "1", "2", "--inputs", str(raw), "--output", str(out)]
    run_main(load("bench_prepare"), argv, monkeypatch)
    text = out.read_text()
    assert "Input: 1 files given" in text
    assert "Result (identical for every setting): 40 documents" in text
    runs = table(text, "| run | processes |")
    assert [r[1] for r in runs] == ["1", "2"] and all(finite(r[2:9]) for r in runs)
    best = table(text, "| processes | best wall s |")
    assert [r[0] for r in best] == ["1", "2"] and all(finite(r[1:]) for r in best)


def test_bench_step_profile_groups_the_step_at_a_toy_shape(tmp_path, monkeypatch) -> None:
    out = tmp_path / "step_profile.md"
    shape = ["--vocab", "60", "--hidden", "16", "--emb", "8", "--ffn", "32", "--layers", "1"]
    shape += ["--heads", "2", "--seq", "16", "--batch", "2", "--steps", "1", "--threads", "1"]
    run_main(load("bench_step_profile"), [*shape, "--out", str(out)], monkeypatch)
    text = out.read_text()
    groups = table(text, "| group | share of self CPU time |")
    assert {"matrix", "optimizer"} <= {g[0] for g in groups} and all(finite(g[1:]) for g in groups)
    assert abs(sum(number(g[1]) for g in groups) - 100) < 1  # shares of one total
    assert len(table(text, "| top operators | share |")) == 15


def mlm_model_dir(folder: Path, vocab_dir: Path) -> Path:
    """A pretraining run's model folder: one-layer weights with the MLM head (no SOP), and the
    vocabulary's files beside them."""
    import shutil

    from tibnlp.config.core import from_dict
    from tibnlp.config.model import ModelConfig
    from tibnlp.models.io import save_pretrained
    from tibnlp.models.pretraining import AlbertForPretraining
    from tibnlp.text.vocab import Vocabulary

    size = Vocabulary.load(vocab_dir).size
    fields = {**TINY_MODEL, "heads": {"small": 2, "large": 2}, "vocab_size": size}
    cfg = from_dict(ModelConfig, fields, "model")
    save_pretrained(AlbertForPretraining(cfg, sop=False), cfg, folder)
    for f in vocab_dir.iterdir():
        shutil.copy2(f, folder / f.name)
    return folder


def tiny_pretraining(root: Path) -> tuple[Path, Path]:
    """A tokenised pretraining data folder (a run's OUTPUT/data) and a model on its vocabulary."""
    from tibnlp.data.pretraining import build_pretraining_dataset
    from tibnlp.text.vocab import Vocabulary

    prepared_inputs(root, n_docs=40, heldout=8, vocab_size=100)
    vocab = Vocabulary.load(root / "vocab")
    data = build_pretraining_dataset(root / "corpus", vocab, 32, root / "data", num_proc=1)
    return data, mlm_model_dir(root / "model", root / "vocab")


def test_bench_word_order_scores_a_model_and_refuses_an_encoder(tmp_path, monkeypatch) -> None:
    from tibnlp.errors import DataError

    data, model = tiny_pretraining(tmp_path)
    out = tmp_path / "word_order.md"
    script = load("bench_word_order")
    run_main(
        script, [str(model), "--data", str(data), "--rows", "8", "--out", str(out)], monkeypatch
    )
    rows = table(out.read_text(), "| model | as written % |")
    assert [r[0] for r in rows] == [str(model)] and finite(rows[0][1:])
    encoder = make_model_dir(tmp_path / "encoder", tmp_path / "vocab")  # no MLM head
    with pytest.raises(DataError, match="no MLM head"):
        run_main(script, [str(model), str(encoder), "--data", str(data)], monkeypatch)
    other = make_model_dir(tmp_path / "other", make_vocab(tmp_path / "other-vocab"))
    with pytest.raises(DataError, match="vocabulary is not the one"):
        run_main(script, [str(other), "--data", str(data)], monkeypatch)


def test_augment_titles_writes_labelled_copies_in_both_modes(tmp_path, monkeypatch) -> None:
    data = make_data_dir(tmp_path / "data")
    model = mlm_model_dir(tmp_path / "model", make_vocab(tmp_path / "vocab"))
    train = data / "tncc" / "tncc_title_train.jsonl"
    originals = {r["id"]: r for r in map(json.loads, train.read_text("utf-8").splitlines())}
    script = load("augment_titles")
    for mode in ("mlm", "unigram"):
        out = tmp_path / f"out-{mode}"
        argv = ["--model", str(model), "--data", str(data), "--out", str(out), "--mode", mode]
        run_main(script, [*argv, "--copies", "2"], monkeypatch)
        written = (out / "tncc" / "tncc_title_train.jsonl").read_text("utf-8").splitlines()
        records = [json.loads(line) for line in written]
        copies = [r for r in records if "-aug" in r["id"]]
        assert [r["id"] for r in records[: len(originals)]] == list(originals)
        assert len(copies) == 2 * len(originals)  # the synthetic titles have no unknown piece
        for r in copies:
            source = originals[r["id"].rsplit("-aug", 1)[0]]
            assert r["label"] == source["label"] and r["text"] == r["title"] != ""
        assert (out / "tncc" / "tncc_title_test.jsonl").read_text() == (
            data / "tncc" / "tncc_title_test.jsonl"
        ).read_text()  # the other files are the source's
        with pytest.raises(SystemExit, match="exists"):
            run_main(script, [*argv], monkeypatch)


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="counts the CPU's host work: on a CUDA host DeepSpeed would put the model on the GPU "
    "and the script's batches stay on the CPU",
)
def test_bench_precision_ops_counts_every_variant_at_zero_0(tmp_path, monkeypatch) -> None:
    script = load("bench_precision_ops")
    calls = in_process(script, monkeypatch)
    out = tmp_path / "clip_ops.md"
    run_main(
        script, ["--zero", "0", "--rounds", "1", "--steps", "1", "--out", str(out)], monkeypatch
    )
    assert sorted(c[3] for c in calls) == sorted(script["VARIANTS"].values())
    text = out.read_text()
    rows = table(text, "| variant | aten ops per step |")
    assert [r[0] for r in rows] == list(script["VARIANTS"])
    assert all(finite(r[1:6]) and number(r[1]) > 0 for r in rows)
    assert "Ratio (bf16 mode / autocast)" in text and "Fused clipping:" in text
    assert rows[0][6] == "torch.bfloat16" and rows[1][6] == "torch.float32"  # what an export saves


def test_bench_vs_transformers_tables_every_variant_at_toy_shapes(tmp_path, monkeypatch) -> None:
    pytest.importorskip("transformers", reason="the comparison needs transformers (tibnlp[bench])")
    # imported here, before the script forks its workers: each would import it again
    from transformers import AlbertForPreTraining  # noqa: F401

    script = load("bench_vs_transformers")
    variants = script["VARIANTS"] + script["ABLATIONS"]
    out = tmp_path / "vs_transformers.md"
    argv = ["--tiny", "--rounds", "1", "--steps", "1", "--threads", "1", "--out", str(out)]
    run_main(script, [*argv, "--variants", ";".join(variants)], monkeypatch)
    text = out.read_text()
    rows = table(text, "| seq | batch | variant |")
    tiny = script["SpeedSettings"].tiny()
    shapes = [(str(s), str(b)) for s, b in tiny.shapes]
    assert [(r[0], r[1], r[2]) for r in rows] == [(*s, v) for s in shapes for v in variants]
    assert all(finite(r[3:]) for r in rows)
    assert f"Shape: vocab {tiny.vocab}, E={tiny.emb}, D={tiny.hidden}," in text
    assert "--tiny`" in text  # the command that wrote it


def test_bench_vocab_builds_and_reports_a_toy_vocabulary(tmp_path, monkeypatch) -> None:
    corpus = write_prepared(tmp_path / "corpus", n_docs=60)
    out = tmp_path / "vocab.json"
    script = load("bench_vocab")
    argv = ["--corpus", str(corpus), "--out-root", str(tmp_path / "vocabs"), "--json", str(out)]
    run_main(script, [*argv, "--runs", "true:100:whole_units+punctuation_pieces"], monkeypatch)
    (run,) = json.loads(out.read_text())["runs"]
    assert (tmp_path / "vocabs" / "vocab-split-100-whole_units-punctuation_pieces").is_dir()
    assert run["split_on_tsheg"] and run["whole_units"] and run["punctuation_pieces"]
    figures = ("wall_s", "peak_rss_mib", "cpu_s", "pieces_per_syllable", "unk_share")
    assert all(math.isfinite(run[k]) for k in figures) and 5 < run["vocab_size"] <= 100
    with pytest.raises(SystemExit, match="unknown switch"):
        run_main(script, [*argv, "--runs", "true:100:no_such_switch"], monkeypatch)


@pytest.mark.slow
@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="measures the CPU layouts (gloo, threads); on a CUDA host the engine takes nccl and "
    "a GPU per process",
)
def test_bench_scaling_runs_both_layouts(tmp_path, monkeypatch) -> None:
    """The real layouts: one process, then two under torchrun (DeepSpeed, gloo)."""
    out = tmp_path / "scaling.md"
    argv = ["--steps", "1", "--repeats", "1", "--seq-len", "8", "--batch", "2", "--vocab", "60"]
    run_main(load("bench_scaling"), [*argv, "--output", str(out)], monkeypatch)
    rows = table(out.read_text(), "| processes | tokens/s per run | median |")
    assert [r[0] for r in rows] == ["1", "2"] and all(finite(r[1:]) for r in rows)
    assert "**Ratio 2 / 1 processes:" in out.read_text()


def one_segmenter(script: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every `WordSegmenter` the test makes, in the script, in word_shards and in the workers
    it forks, is one real botok segmenter loaded once: each load of its trie takes seconds, and
    a corpus's words and the script's two measurements would load it six times."""
    from tibnlp.text import word_shards, words

    made: list[Any] = []

    def shared(*args: Any, **kwargs: Any) -> Any:
        if not made:
            made.append(words.WordSegmenter(*args, **kwargs))
        return made[0]

    monkeypatch.setattr(word_shards, "WordSegmenter", shared)
    monkeypatch.setitem(script["main"].__globals__, "WordSegmenter", shared)


def test_bench_words_tables_segmentation_cost_and_masks(tmp_path, monkeypatch) -> None:
    """A corpus prepared with its words (botok; the trie in the user's cache, as the other word
    tests leave it) is all three inputs: the measured run, the sampled corpus, the masks'."""
    from tibnlp.config import CorpusConfig, VocabConfig
    from tibnlp.errors import DataError
    from tibnlp.text.prepare import prepare_corpus
    from tibnlp.text.vocab_build import build_vocabulary
    from tibnlp.text.words import require_pack

    pytest.importorskip("botok", reason="word segmentation needs the botok package")
    try:
        require_pack()
    except DataError as exc:
        pytest.skip(f"needs the botok dialect pack: {exc}")
    script = load("bench_words")
    one_segmenter(script, monkeypatch)
    rng = random.Random(0)
    words = ["་".join(syllable(rng) for _ in range(rng.choice([1, 2]))) for _ in range(150)]
    raw = tmp_path / "tiny.txt"
    raw.write_text("\n\n".join(" ".join(sentence(rng, words) for _ in range(6)) for _ in range(40)))
    corpus = tmp_path / "corpus"
    cfg = CorpusConfig(num_proc=1, heldout_fraction=0.1, words=True)
    prepare_corpus([raw], corpus, cfg, progress=False)
    vocab = tmp_path / "vocab"
    build_vocabulary(corpus, vocab, VocabConfig(vocab_size=150, num_threads=1))
    out = tmp_path / "wwm.md"
    argv = ["--words-corpus", str(corpus), "--full", str(corpus), "--vocab", str(vocab)]
    argv += ["--sample-chars", "400", "--mask-docs", "20", "--seq-len", "32", "--output", str(out)]
    run_main(script, argv, monkeypatch)
    text = out.read_text()
    (cost,) = table(text, "| source | sample chars |")
    assert cost[0] == "tiny.txt" and finite(cost[1:])
    masks = table(text, "| masking | pieces masked / real pieces |")
    assert [m[0] for m in masks] == ["span", "whole_word"] and all(finite(m[1:3]) for m in masks)
    assert masks[1][3].startswith("0 ")  # whole-word masking cuts no word
    # --no-sample: the full corpus's cost from the measured run's rate
    measured = script["measured_run"](corpus / "words")
    assert "syllables per CPU-second" in "\n".join(script["_from_run"](measured, 10**6))
