"""benchmarks/tncc_label_agreement.py: how often a title repeated across splits keeps its label,
and the bounds on attainable accuracy that follow."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest

from tests.ft_fixtures import LABELS, make_data_dir

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "tncc_label_agreement.py"


def _write(path: Path, rows: list[tuple[str, int]]) -> None:
    records = [
        {"id": f"{path.stem}-{i}", "label": LABELS[y], "label_id": y, "text": t}
        for i, (t, y) in enumerate(rows)
    ]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), "utf-8")


def test_agreement_counts_repeats_by_the_model_text_and_bounds_the_accuracy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_data_dir(tmp_path / "data")
    tncc = root / "tncc"
    # train: "ཀ ཁ" twice with two labels, "ག ང" once; test repeats both, once typed with tsheg
    # and a closing shad (the same model text), and has one title of its own
    _write(tncc / "tncc_title_train.jsonl", [("ཀ ཁ", 0), ("ཀ ཁ", 1), ("ག ང", 2), ("ཅ ཆ", 0)])
    _write(tncc / "tncc_title_validation.jsonl", [("ཇ ཉ", 1)])
    _write(tncc / "tncc_title_test.jsonl", [("ཀ་ཁ།", 0), ("ག ང", 2), ("ཏ ཐ", 1)])
    monkeypatch.setenv("TIBNLP_DATA", str(root))
    out = tmp_path / "agreement.md"
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--out", str(out)])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    text = out.read_text("utf-8")
    # "ཀ ཁ" agrees with half its train copies, "ག ང" with all: (0.5 + 1) / 2 = 75 %;
    # the attainable accuracy on them lies between 75 % and sqrt(0.75) = 86.6 %
    assert "| test | 3 | 2 | 75.0 % | 75.0 to 86.6 % |" in text
    assert "| validation | 1 | 0 |" in text
    assert "2 texts" not in text and "1 texts occur more than once, 1 of them" in text


def test_classifiers_are_scored_on_the_repeated_titles_and_on_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.ft_fixtures import make_vocab
    from tibnlp.config import load_config
    from tibnlp.training.finetune import run_finetune

    root = make_data_dir(tmp_path / "data")  # one test title repeats a training title
    monkeypatch.setenv("TIBNLP_DATA", str(root))
    cfg = load_config(
        None,
        [
            f"finetune.vocab={make_vocab(tmp_path / 'vocab')}",
            f"finetune.output={tmp_path / 'runs'}",
            "finetune.encoder=none",
            "finetune.epochs=3",
            "finetune.batch_size=16",
            "finetune.embedding_size=16",
            "finetune.cnn_channels=8",
            "finetune.optimizer.lr=0.01",
            "tracking.enabled=false",
        ],
    )
    seed = run_finetune(cfg, "tncc").seeds[0]
    out = tmp_path / "agreement.md"
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), str(seed.directory), "--out", str(out)])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    row = next(line for line in out.read_text("utf-8").splitlines() if str(seed.directory) in line)
    whole, repeated, others = (cell.strip() for cell in row.split("|")[2:5])
    # the run's own test accuracy; the one repeated title is right or wrong
    assert whole == f"{100 * seed.metrics['test']['accuracy']:.1f} %"
    assert repeated in ("0.0 %", "100.0 %")
    assert others.endswith(" %")
