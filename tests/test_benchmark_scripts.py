"""The benchmark scripts behind benchmarks/results/ still run: each at a toy size, writing its
table, so a measured result stays "a command in the repo that anyone can re-run" while the
package changes under it. Nothing here asserts a time or a speed ratio (machine load moves
them): only that the rows exist and their numbers are finite."""

from __future__ import annotations

import math
import runpy
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str) -> dict[str, Any]:
    return runpy.run_path(str(BENCH / f"{name}.py"))


def run_main(script: dict[str, Any], argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", [script["__file__"], *argv])
    script["main"]()


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
