"""What makes a published output out of date under its own key: dataset files read by name
whose content changed since (`StageDef.data`), and extra sets asked since it was made
(`StageDef.rescored`: `finetune.eval_also`).

An extra test set is scored from the saved classifiers, apart from the training
(`eval_sha256`, `training/finetune_seeds.py`), so it is no part of a fine-tuning stage's key:
asking for one more reruns the stage on a copy of its output, where every seed is reported
as it was and only scored on the new set; dropping one leaves the output up to date.
"""

from __future__ import annotations

import shutil
from typing import Any

from tibnlp.fsutil import staged_dir
from tibnlp.pipeline.cache import MANIFEST, Slot, cached_elsewhere
from tibnlp.pipeline.keys import get_dotted


def changed_data(manifest: dict[str, Any], data: dict[str, str]) -> str:
    """The files read by name whose content differs from when the cached output was made
    (none: ""). A manifest from before they were recorded, or a file absent now, is not
    compared: only a known difference reruns."""
    before = manifest.get("data")
    if not isinstance(before, dict):
        return ""
    changed = sorted(name for name, digest in data.items() if before.get(name, digest) != digest)
    more = f" (+{len(changed) - 3} more)" if len(changed) > 3 else ""
    return ", ".join(changed[:3]) + more


def asked_sets(config: dict[str, Any], keys: tuple[str, ...]) -> dict[str, list[str]]:
    """The extra sets the stage's config asks for, by key (`finetune.eval_also` -> [advts])."""
    return {key: sorted(map(str, get_dotted(config, key) or [])) for key in keys}


def unscored(manifest: dict[str, Any], asked: dict[str, list[str]]) -> list[str]:
    """The asked sets the published output was not scored on. A manifest without `scored`
    was made before it was recorded, when such a set was in the key: it was scored on none."""
    done = manifest.get("scored")
    done = done if isinstance(done, dict) else {}
    return [
        f"{key}={name}"
        for key, names in asked.items()
        for name in names
        if name not in (done.get(key) or [])
    ]


def keyed_with_sets(
    slot: Slot, key: str, asked: dict[str, list[str]]
) -> tuple[Slot, dict[str, Any]] | None:
    """An output published before the extra sets left the key, under its key then (`key`, which
    held them: so it was scored on the sets asked now), as the published output of the stage.
    Without it, every fine-tuning stage cached before would have trained all its seeds again,
    and each stage after it run again; its readers' keys still hold this key, so they stay
    cached too. Asking for another set later finds no such output: that stage runs in full
    once, as it did before."""
    manifest = slot.manifest(key)
    found = (slot, manifest) if manifest is not None else cached_elsewhere(slot, key)
    if found is None:
        return None
    old, manifest = found  # (published again since by a run of this stage: its `scored` holds)
    done = manifest.get("scored")
    done = done if isinstance(done, dict) else {}
    return old, {**manifest, "scored": {**asked, **done}}


def reuse_output(slot: Slot) -> None:
    """The published output copied to the stage's partial folder, for a run that only scores
    new sets from it (its manifest and run file left out: a new publication, a new run).

    Copied in a temporary folder renamed into place: a copy cut short (Ctrl-C, disk full)
    leaves no partial, which a rerun would resume, retraining the seeds not copied yet and
    reading a classifier cut mid-write; it copies again."""
    ignore = shutil.ignore_patterns(MANIFEST, slot.run_file.name)
    with staged_dir(slot.partial) as tmp:
        shutil.copytree(slot.final, tmp, ignore=ignore, dirs_exist_ok=True)


def scored_now(
    manifest: dict[str, Any] | None, asked: dict[str, list[str]], rescore: bool
) -> dict[str, list[str]]:
    """The sets a new publication is scored on: those asked, and with `rescore` (a run on a
    copy of the output) those its output held already."""
    done = (manifest or {}).get("scored") if rescore else None
    done = done if isinstance(done, dict) else {}
    return {k: sorted({*asked.get(k, []), *(done.get(k) or [])}) for k in {*asked, *done}}
