"""Markdown tables as the reports write them (results.md, a pipeline's summary, `runs
compare --format markdown`).

A cell is escaped: a `|` or a line break in a name or path (a system, a pipeline run, a
recipe value, a tag) would otherwise end the cell or the row, and every column after it
would shift. The rich tables printed on a terminal escape their cells for rich markup
instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def markdown_cell(text: str) -> str:
    """`text` as one cell: `\\` and `|` backslash-escaped (the backslash first, so that a
    `\\|` in the text does not read as an escaped pipe), each line break a space."""
    return " ".join(text.replace("\\", "\\\\").replace("|", "\\|").splitlines())


def markdown_rows(head: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """The lines of a table: `head`, the rule under it, then one line per row."""
    lines = [_line(head), "|" + "---|" * len(head)]
    return lines + [_line(row) for row in rows]


def _line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(map(markdown_cell, cells)) + " |"
