"""What a pipeline's work dir holds that its current plan does not use, and removing it.

Every change of settings gives a stage a new key and a new output folder (`<variant>-<key>`);
the old ones stay, as do the `.partial` folders of runs that were interrupted and never
resumed. Pretraining outputs hold checkpoints, so a work dir grows with every experiment.
`tibnlp pipeline clean FILE` lists the stage outputs the plan of FILE (with the same --set
and --workdir) does not use; with --yes it removes them, holding the work dir as a run does.
Only folders the pipeline made are touched: published outputs (with their manifest),
`.partial` and `.old` folders, under the folders of the file's own stages.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from tibnlp.pipeline.cache import MANIFEST, explain_change
from tibnlp.pipeline.planner import Planner, Step

_KEYED = re.compile(r".+-[0-9a-f]{12}(\.partial)?")
_ASIDE = re.compile(r"\..+\.old(-\d+)?")  # a republish's old output, left by a crash


@dataclass
class Unused:
    path: Path
    bytes: int
    why: str  # "output of other settings", "interrupted run", "left by a republish"


def _size(path: Path) -> int:
    total = 0
    for item in path.rglob("*"):
        try:
            if item.is_file() and not item.is_symlink():
                total += item.stat().st_size
        except OSError:
            continue
    return total


def _why(entry: Path) -> str:
    """What an entry of a stage folder is, "" when the pipeline did not make it."""
    if not entry.is_dir() or entry.is_symlink():
        return ""
    if _ASIDE.fullmatch(entry.name):
        return "left by a republish"
    if not _KEYED.fullmatch(entry.name):
        return ""
    if entry.name.endswith(".partial"):
        return "interrupted run"
    return "output of other settings" if (entry / MANIFEST).is_file() else ""


def _prefix(folder: Path) -> str:
    """The variant part of an output folder's name (`out` without one)."""
    return folder.name.removesuffix(".partial").rsplit("-", 1)[0]


def _differs(entry: Path, steps: list[Step]) -> str:
    """How a published output's settings differ from those the plan gives its variant: a
    config change, or the same settings under keys an upgrade of tibnlp changed (an output
    one may still want: it is a complete model the new code would train again)."""
    same = [s for s in steps if s.slot.final.parent == entry.parent]
    step = next((s for s in same if _prefix(s.slot.final) == _prefix(entry)), None)
    try:
        manifest = json.loads((entry / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        manifest = None
    if step is None or not isinstance(manifest, dict):
        return "output of other settings"
    said = explain_change(manifest, step.config, step.inputs)
    if said.startswith("stage definition"):
        return "same settings, made by another tibnlp version (its keys changed)"
    return f"output of other settings: {said}"


def unused_outputs(planner: Planner) -> list[Unused]:
    """The folders under the plan's stage folders that no step of the plan uses."""
    steps = planner.plan()
    used = {p.resolve() for s in steps for p in (s.slot.final, s.slot.partial)}
    found = []
    top = os.path.abspath(planner.workdir)
    for folder in sorted({s.slot.final.parent for s in steps}):
        # only the work dir's own stage folders (a stage named '..' was its parent)
        if os.path.dirname(os.path.abspath(folder)) != top or not folder.is_dir():
            continue
        for entry in sorted(folder.iterdir()):
            why = _why(entry)
            if why and entry.resolve() not in used:
                if why == "output of other settings":
                    why = _differs(entry, steps)
                found.append(Unused(entry, _size(entry), why))
    return found


def remove(unused: list[Unused]) -> int:
    """Remove the folders; the bytes freed."""
    freed = 0
    for item in unused:
        shutil.rmtree(item.path)
        freed += item.bytes
    return freed
