"""`map_batches` over processes: rows in order, and its bar is a log (stderr), never the output."""

from __future__ import annotations

from pathlib import Path

import datasets
import pytest

from tibnlp.text.process_map import map_batches


def _double(batch: dict[str, list[int]]) -> dict[str, list[int]]:
    return {"y": [2 * x for x in batch["x"]]}


def test_rows_in_order_and_the_bar_on_stderr(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The bar went to stdout (rich's default console): `tibnlp pretrain`'s tokenising wrote
    its lines there with two processes, and to stderr with one (datasets' own bar)."""
    data = datasets.Dataset.from_dict({"x": list(range(50))})
    out = map_batches(
        data,
        _double,
        {},
        2,
        tmp_path,
        "doubling",
        True,
        batch_size=8,
        writer_batch_size=8,
        remove_columns=["x"],
    )
    assert out["y"] == [2 * x for x in range(50)]
    said = capfd.readouterr()
    assert said.out == "" and "doubling" in said.err
