"""benchmarks/seed_ensemble.py: the mean-probability ensemble of a system's seeds, scored and
compared on TNCC's validation and test items."""

from __future__ import annotations

import json
import re
import runpy
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import f1_score

from tests.ft_fixtures import make_data_dir, make_vocab, tiny_textcnn
from tibnlp.config import load_config
from tibnlp.evaluation.predict import Predictor
from tibnlp.training.finetune import run_finetune

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "seed_ensemble.py"


def test_ensembles_are_scored_and_compared_per_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = make_data_dir(tmp_path / "data")
    monkeypatch.setenv("TIBNLP_DATA", str(root))
    vocab = make_vocab(tmp_path / "vocab")
    overrides = tiny_textcnn(vocab, tmp_path / "runs", "finetune.seeds=[1,2]", "finetune.epochs=1")
    system = run_finetune(load_config(None, overrides), "tncc").seeds[0].directory.parent
    assert sorted(p.name for p in system.glob("seed-*")) == ["seed-1", "seed-2"]
    single = tmp_path / "single"  # system B: seed 1 alone, an ensemble of one
    shutil.copytree(system / "seed-1", single / "seed-1")
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), str(system), str(single), "--resamples", "50"])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    out = capsys.readouterr().out.splitlines()  # DeepSpeed may log to stdout on import
    lines = [line for line in out if line.startswith(("validation:", "test:"))]
    assert [line.split(":")[0] for line in lines] == ["validation", "test"]
    # the ensemble by hand: argmax of the two seeds' summed probabilities on the test titles
    records = [
        json.loads(x) for x in (root / "tncc" / "tncc_title_test.jsonl").open(encoding="utf-8")
    ]
    predictors = [Predictor(system / f"seed-{s}") for s in (1, 2)]
    labels = predictors[0].meta.labels
    total = sum(
        np.array(
            [
                [r["probabilities"][n] for n in labels]
                for r in p.predict([x["text"] for x in records])
            ]
        )
        for p in predictors
    )
    truth = [labels.index(r["label"]) for r in records]

    def macro(probs: np.ndarray) -> float:
        return 100 * f1_score(truth, probs.argmax(1), average="macro", labels=range(len(labels)))

    first = np.array(
        [
            [r["probabilities"][n] for n in labels]
            for r in predictors[0].predict([x["text"] for x in records])
        ]
    )
    m = re.match(
        r"test: ensemble macro-F1 A ([\d.]+), B ([\d.]+), A - B ([+-][\d.]+) \[",
        lines[1],
    )
    assert m, lines[1]
    assert abs(macro(total) - macro(first)) > 0.5, lines  # the two systems differ
    assert float(m[1]) == pytest.approx(macro(total), abs=0.006)
    assert float(m[2]) == pytest.approx(macro(first), abs=0.006)
    assert float(m[3]) == pytest.approx(macro(total) - macro(first), abs=0.011)
