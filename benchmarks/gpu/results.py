"""benchmarks/results/gpu.md: hand-written text with generated sections between markers.

Each harness part writes its section to its output folder (`section-PART.md`); on the device
that folder is $OUT, which comes back. `collect DIR` then puts every section found in DIR
into gpu.md here, so the file only changes on purpose (a CPU-mode test never touches it).
"""

from __future__ import annotations

import re
from pathlib import Path

from tibnlp.fsutil import atomic_write_text

RESULTS = Path("benchmarks/results/gpu.md")
# every part `run` writes a section for (tests/test_gpu_harness.py holds them together)
PARTS = ("bundle", "check", "speed", "pretrain", "curve", "wide", "loop", "finetune")


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- gpu:{name} -->", f"<!-- /gpu:{name} -->"


def update_section(name: str, text: str, path: Path = RESULTS) -> None:
    """Replace the text between the markers of `name` (appended when they are missing)."""
    start, end = _markers(name)
    body = f"{start}\n{text.strip()}\n{end}"
    old = path.read_text(encoding="utf-8") if path.exists() else "# GPU results\n"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    new = pattern.sub(lambda _: body, old) if pattern.search(old) else f"{old.rstrip()}\n\n{body}\n"
    atomic_write_text(path, new)


def write_part(out: Path, name: str, text: str) -> Path:
    path = out / f"section-{name}.md"
    atomic_write_text(path, text.strip() + "\n")
    return path


def collect(folder: Path, path: Path = RESULTS) -> list[str]:
    """Every `section-PART.md` in `folder` into gpu.md; returns the parts found."""
    found = []
    for name in PARTS:
        section = folder / f"section-{name}.md"
        if section.exists():
            update_section(name, section.read_text(encoding="utf-8"), path)
            found.append(name)
    if not found:
        raise SystemExit(f"collect: no section-PART.md in {folder} (parts: {', '.join(PARTS)})")
    return found
