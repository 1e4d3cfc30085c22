"""Content-addressed stage outputs: a node's key is the hash of its kind, the config sections
that define it, its params and its inputs (data by content, upstream stages by their keys).

Outputs are built in `<dir>.partial` and renamed to `<dir>` with a manifest only when the stage
returns, so a published directory is always complete; an interrupted stage leaves its partial
directory, which the next run resumes into (pretraining continues from its checkpoints).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tibnlp.config.core import flatten
from tibnlp.fsutil import atomic_write_text
from tibnlp.standard_json import dumps
from tibnlp.tracking.conventions import config_hash

MANIFEST = ".tibnlp-stage.json"
_SALT = "tibnlp-pipeline-v1"


# A stage kind's output revision, raised when a code change alters what the stage writes for
# the same settings and inputs, so outputs cached before the change run again instead of being
# reused. A kind not listed is at revision 1, which leaves its keys as they were.
OUTPUT_REVISION: dict[str, int] = {
    # 2: without a pair task, a one-sentence chunk is `[CLS] text [SEP]`, no longer cut into
    # `[CLS] A [SEP] B [SEP]` (659a990): the corpus and title stages train on other examples
    "pretrain": 2,
}


def node_key(kind: str, sections: dict[str, Any], params: dict[str, Any], inputs: Any) -> str:
    key: dict[str, Any] = {
        "salt": _SALT,
        "kind": kind,
        "config": sections,
        "params": params,
        "inputs": inputs,
    }
    if (revision := OUTPUT_REVISION.get(kind, 1)) > 1:
        key["revision"] = revision
    return config_hash(key)


_CUT = 80  # characters of a stage or variant name in a file name


def _file_chars(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=+-]+", "_", text)


def _safe(text: str) -> str:
    return _file_chars(text)[:_CUT] or "out"


def _cut(text: str) -> bool:
    return len(_file_chars(text)) > _CUT


@dataclass
class Slot:
    """Where one node's output lives."""

    final: Path
    partial: Path
    last: Path  # pointer to the node's latest key, to explain why a stage reruns

    @property
    def manifest_path(self) -> Path:
        return self.final / MANIFEST

    def manifest(self, key: str) -> dict[str, Any] | None:
        """The published manifest when it holds `key` (the output is complete and current)."""
        try:
            data = json.loads(self.manifest_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if data.get("key") == key else None

    @property
    def run_file(self) -> Path:
        return self.partial / ".tibnlp-run.json"

    def run_record(self) -> dict[str, Any]:
        """What the partial output's run file says: its MLflow run and the upstream outputs it
        was made from ({} when there is none, or it was cut short)."""
        try:
            data = json.loads(self.run_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def output_of(self, manifest: dict[str, Any]) -> Path:
        rel = manifest.get("output_rel") or ""
        return self.final / rel if rel else self.final

    def previous(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.last.read_text(encoding="utf-8"))
            return data if isinstance(data, dict) else None
        except (OSError, ValueError):
            return None

    def publish(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Atomically turn the partial directory into the published output; the manifest
        written. Each publication gets its own id: a forced or data-changed rerun republishes
        under the same key, and the stages that read the old output must see that they did."""
        manifest = {
            **manifest,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "published": uuid.uuid4().hex,
        }
        atomic_write_text(
            self.partial / MANIFEST, dumps(manifest, indent=1, ensure_ascii=False, default=str)
        )
        # a forced rerun: move the old output aside (one rename) before deleting it, so an
        # interruption never leaves a half-deleted folder under its manifest
        old = self.final.with_name(f".{self.final.name}.old")
        if old.exists():
            shutil.rmtree(old)
        if self.final.exists():
            self.final.rename(old)
        os.replace(self.partial, self.final)
        pointer = {k: manifest[k] for k in ("key", "config", "inputs") if k in manifest}
        atomic_write_text(self.last, json.dumps(pointer, indent=1, ensure_ascii=False, default=str))
        if old.exists():
            shutil.rmtree(old)
        return manifest


def publication(manifest: dict[str, Any]) -> str | None:
    """Which publication of an output a manifest is (an output published before the ids were
    recorded: its finish time)."""
    value = manifest.get("published") or manifest.get("finished")
    return str(value) if value else None


def slot_for(workdir: Path, stage: str, variant: str, key: str) -> Slot:
    base = Path(workdir) / _safe(stage)
    name = f"{_safe(variant) if variant else 'out'}-{key[:12]}"
    # Output folders carry the key, so names cut alike cannot meet there (and moving them
    # would rerun cached stages); the last-run pointer does not: when a name is cut, its
    # pointer gets a hash of the whole stage and variant name, so stages or variants that
    # share their first 80 characters (and a folder) keep one pointer each.
    tag = ""
    if _cut(stage) or _cut(variant):
        tag = "-" + hashlib.sha256(f"{stage}\0{variant}".encode()).hexdigest()[:10]
    last = base / f".last-{_safe(variant or 'out')}{tag}.json"
    return Slot(base / name, base / f"{name}.partial", last)


def cached_elsewhere(slot: Slot, key: str) -> tuple[Slot, dict[str, Any]] | None:
    """A published output of `key` in a sibling folder (the key does not hold the variant's
    name, so a renamed variant, or a grid removed down to one of its values, finds the output
    it made under its old name instead of running again)."""
    base = slot.final.parent
    if not base.is_dir():
        return None
    for folder in sorted(base.glob(f"*-{key[:12]}")):
        if folder == slot.final or not folder.is_dir():
            continue
        other = Slot(folder, folder.with_name(f"{folder.name}.partial"), slot.last)
        if (manifest := other.manifest(key)) is not None:
            return other, manifest
    return None


def explain_change(old: dict[str, Any] | None, config: dict[str, Any], inputs: Any) -> str:
    """Why a node's key differs from its last published run, in words."""
    if old is None:
        return "no output yet"
    if old.get("inputs") != json.loads(json.dumps(inputs, default=str)):
        return "inputs changed"
    before, after = flatten(old.get("config") or {}), flatten(config)
    changed = [k for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k)]
    if changed:
        shown = ", ".join(f"{k}: {before.get(k)!r} -> {after.get(k)!r}" for k in changed[:3])
        more = f" (+{len(changed) - 3} more)" if len(changed) > 3 else ""
        return f"config changed: {shown}{more}"
    return "stage definition or its output revision (code) changed"
