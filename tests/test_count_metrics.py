"""Counts of texts (`*_flip_excluded`, `cut_*`) are shown as counts in every table: never x100
by --percent, and once, without a spread, when every seed holds the same count."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from typer.testing import CliRunner

from tibnlp.cli.main import app
from tibnlp.evaluation.report import markdown_table
from tibnlp.tracking import Tracker
from tibnlp.tracking.testing import sqlite_store

# system -> per seed: (test macro-F1, texts the shad flip rate left out)
SEEDS = {"same": [(0.5, 3.0), (0.7, 3.0)], "differ": [(0.6, 2.0), (0.6, 4.0)]}


def _store(folder: Path) -> str:
    uri = sqlite_store(folder)
    for system, seeds in SEEDS.items():
        tags = {"tibnlp.model": system}
        with Tracker("counts", system, uri=uri, buffer_dir=folder / "buf", tags=tags) as parent:
            parent.log_metrics({"cut_test_texts": 5.0})  # the parent's own: seeds lack it
            for seed, (f1, left_out) in enumerate(seeds, start=1):
                run = parent.child(f"seed {seed}", tags=tags)
                run.log_metrics({"test_macro_f1": f1, "test_shad_flip_excluded": left_out})
                run.end()
    return uri


def _compare(uri: str, fmt: str, metric: str = "test_*") -> list[list[str]]:
    args = ["runs", "compare", "-e", "counts", "-m", metric, "--percent"]
    result = CliRunner().invoke(app, [*args, "-f", fmt, "--digits", "2", "--tracking-uri", uri])
    assert result.exit_code == 0, result.output
    if fmt == "csv":
        return list(csv.reader(io.StringIO(result.stdout)))
    lines = result.stdout.strip().splitlines()
    return [[c.strip() for c in line.split("|")[1:-1]] for line in (lines[0], *lines[2:])]


def test_runs_compare_shows_counts_as_counts_beside_rates_in_percent(tmp_path: Path) -> None:
    uri = _store(tmp_path)
    head, same, differ = _compare(uri, "markdown")
    assert head == ["tibnlp.model", "runs", "test_macro_f1", "test_shad_flip_excluded"]
    assert same[2:] == ["60.00 ± 14.14", "3"]  # not 300.00 ± 0.00
    assert differ[2:] == ["60.00 ± 0.00", "3.0 ± 1.4"]  # a mean of counts, not x100
    # the parent runs' counts (its seeds lack them: the parents are the leaves)
    assert [r[2] for r in _compare(uri, "markdown", "cut_*")] == ["cut_test_texts", "5", "5"]
    head, same, differ = _compare(uri, "csv")
    values = dict(zip(head, differ, strict=True))
    assert float(values["test_shad_flip_excluded mean"]) == 3.0
    assert float(values["test_macro_f1 mean"]) == 60.0  # the rates still in %


def test_result_table_shows_the_texts_left_out_as_a_count() -> None:
    def row(system: str, left_out: float) -> dict:
        test = {"macro_f1": {"mean": 0.5, "std": 0.1}, "shad_flip_rate": {"mean": 0.1, "std": 0}}
        test["shad_flip_excluded"] = {"mean": left_out, "std": 0.0}
        return {"system": system, "dataset": "d", "seeds": [{}, {}], "aggregate": {"test": test}}

    lines = markdown_table([row("a", 12.0), row("b", 0.0)]).splitlines()
    head = [c.strip() for c in lines[0].split("|")[1:-1]]
    cells = [
        dict(zip(head, (c.strip() for c in ln.split("|")[1:-1]), strict=True)) for ln in lines[2:]
    ]
    assert cells[0]["shad flips"] == "10.00 ± 0.00"
    assert (
        cells[0]["shad flips: texts left out"] == "12"
        and cells[1]["shad flips: texts left out"] == "0"
    )
    # a table where no text was left out keeps its columns as they were
    assert "shad flips: texts left out" not in markdown_table([row("b", 0.0)])


def test_one_rule_names_the_counts() -> None:
    from tibnlp.evaluation.counts import count_text, is_count

    for name in ("test_shad_flip_excluded", "shad_flip_excluded", "test_tsheg_flip_excluded_mean",
                 "cut_test_texts", "cut_advts_tokens_dropped_std"):  # fmt: skip
        assert is_count(name), name
    for name in ("test_shad_flip_rate", "test_macro_f1_mean", "advts_accuracy", "loss"):
        assert not is_count(name), name
    assert count_text(12.0, 0.0) == "12" and count_text(2.5, 0.7071) == "2.5 ± 0.7"


def test_percent_scales_fractions_only(tmp_path: Path) -> None:
    """A loss or a number of tokens x100 reads as what it is not: `--percent` is for F1,
    precision, recall, accuracy and flip rates."""
    from tibnlp.evaluation.counts import is_fraction

    uri = sqlite_store(tmp_path)
    with Tracker("counts", "p", uri=uri, buffer_dir=tmp_path / "buf") as parent:
        for seed, (f1, loss) in enumerate(((0.5, 2.0), (0.7, 3.0)), start=1):
            run = parent.child(f"seed {seed}")
            run.log_metrics({"test_macro_f1": f1, "test_loss": loss, "export_tokens": 1e6})
            run.end()
    head, row = _compare(uri, "markdown")
    cells = dict(zip(head, row, strict=True))
    assert cells["test_macro_f1"] == "60.00 ± 14.14" and cells["test_loss"] == "2.50 ± 0.71"
    head, row = _compare(uri, "csv", "*")
    values = dict(zip(head, row, strict=True))
    assert float(values["export_tokens mean"]) == 1e6 and float(values["test_loss std"]) > 0.7
    for name in ("test_macro_f1_mean", "validation_weighted_recall", "mlm_accuracy",
                 "test_shad_flip_rate_std", "advts_macro_precision", "unk_share",
                 "route_large_fraction", "memory_share_mean"):  # fmt: skip
        assert is_fraction(name), name
    for name in ("test_loss", "export_tokens", "cut_test_texts", "lr", "test_shad_flip_excluded"):
        assert not is_fraction(name), name
