"""Checkpoints through DeepSpeed's save/load with a completeness marker and rotation.

Layout: `OUTPUT/checkpoints/step00000200/` (DeepSpeed files, one tag per save) and
`OUTPUT/checkpoints/latest` naming the newest *complete* tag. DeepSpeed's own `latest` is not
used (`save_latest=False`): ours is written atomically by rank 0 only after every rank has
finished writing, so a run killed mid-save resumes from the previous checkpoint. Anything
needed to continue bit-exactly rides in `client_state`: RNG states, data position, MLflow run
id, the running log window, the loop's `extra_state` (e.g. the learning check's verdict).
Everything there is tensors, lists, numbers and flags, so it loads with `weights_only=True`.
"""

from __future__ import annotations

import json
import pickle
import random
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tibnlp.errors import TibnlpError
from tibnlp.fsutil import atomic_write_text
from tibnlp.training.engine import all_gather_objects, barrier

MARKER = "latest"
LAYOUT = "tibnlp-layout.json"  # in each tag: the ZeRO stage and process count that saved it
_TAG = re.compile(r"^step(\d{8})$")
_SHARD = re.compile(r"^zero_pp_rank_(\d+)_mp_rank_00_optim_states\.pt$")


def tag_for(step: int) -> str:
    return f"step{step:08d}"


def rng_state() -> dict[str, Any]:
    """Python, numpy and torch RNG states as weights_only-safe values (ints, lists, tensors)."""
    version, py_state, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(py_state), gauss],
        "numpy": [
            kind,
            torch.from_numpy(np.asarray(keys).astype(np.int64)),
            pos,
            has_gauss,
            cached,
        ],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, py_state, gauss = state["python"]
    random.setstate((version, tuple(py_state), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def rank_rng_states() -> list[dict[str, Any]]:
    """Every rank's `rng_state()`, in rank order (collective). DeepSpeed writes the
    client_state of data-parallel rank 0 only, so each rank's own streams (dropout differs
    per rank) must travel in that one copy."""
    return all_gather_objects(rng_state())


def set_rank_rng_state(saved: dict[str, Any] | list[dict[str, Any]], rank: int) -> None:
    """Restore this rank's states from `rank_rng_states()` (or one `rng_state()`, as
    checkpoints before it held); a rank the checkpoint has no states of keeps its own."""
    if isinstance(saved, dict):
        set_rng_state(saved)
    elif rank < len(saved):
        set_rng_state(saved[rank])


def latest_tag(directory: Path) -> str | None:
    """The newest complete checkpoint's tag, or None."""
    marker = Path(directory) / MARKER
    if not marker.is_file():
        return None
    tag = marker.read_text(encoding="utf-8").strip()
    return tag if (Path(directory) / tag).is_dir() else None


def save(
    engine: Any,
    directory: Path,
    step: int,
    client_state: dict[str, Any],
    keep: int,
    is_main: bool,
) -> Path:
    """Collective: every rank calls it. Returns the checkpoint folder."""
    directory = Path(directory)
    tag = tag_for(step)
    engine.save_checkpoint(str(directory), tag=tag, client_state=client_state, save_latest=False)
    if is_main:
        layout = {"zero_stage": _stage(engine), "processes": _processes(engine)}
        atomic_write_text(directory / tag / LAYOUT, json.dumps(layout) + "\n")
    barrier()  # every rank's shard is on disk before the marker says "complete"
    if is_main:
        atomic_write_text(directory / MARKER, tag + "\n")
        _prune(directory, keep)
    barrier()
    return directory / tag


def _prune(directory: Path, keep: int) -> None:
    """Keep the newest `keep` complete tags. A partial folder newer than the marker (a save
    that was killed) is left alone: the next save of that step overwrites it. `keep` 0:
    keep them all."""
    for tag in complete_tags(directory)[keep:] if keep else []:
        shutil.rmtree(directory / tag, ignore_errors=True)


def complete_tags(directory: Path) -> list[str]:
    """The complete checkpoints' tags, newest first: those at or before the marker's (a
    folder newer than it is a save that was killed)."""
    current = latest_tag(directory)
    if current is None:
        return []
    newest = int(current[4:])
    steps = (
        int(m.group(1))
        for p in Path(directory).iterdir()
        if p.is_dir() and (m := _TAG.match(p.name))
    )
    return [tag_for(s) for s in sorted((s for s in steps if s <= newest), reverse=True)]


def require_resumable(directory: Path, resume: bool) -> None:
    """`--resume` needs a complete checkpoint in `directory`, a fresh start needs none there.
    Cheap (the marker only): a run checks it before tokenising or writing anything."""
    found = latest_tag(directory) is not None
    if resume and not found:
        raise no_checkpoint(directory)
    if found and not resume:
        raise TibnlpError(
            f"{directory} already holds checkpoints of an earlier run",
            "add --resume to continue it, or set pretrain.output to a new folder",
        )


def no_checkpoint(directory: Path) -> TibnlpError:
    return TibnlpError(
        f"--resume: no complete checkpoint in {directory}",
        "run without --resume to start, or point pretrain.output at the earlier run",
    )


def load(engine: Any, directory: Path, is_main: bool) -> tuple[str, dict[str, Any]] | None:
    """Collective: load the newest complete checkpoint; returns (tag, client_state) or None.
    `is_main`: this rank says what the ranks decided (once, not once per rank).

    One that cannot be read (files cut short or deleted since) is passed over, with a
    warning, for the next older one, as `--resume` promises; one refused as unsafe is not.
    Every rank decides on every rank's outcome, and reports the first failing rank's reason:
    a shard only one rank reads can be the damaged one."""
    tags = complete_tags(directory)
    for n, tag in enumerate(tags):
        _require_same_partitions(engine, Path(directory) / tag)
        reason: str | None = None
        try:
            path, client_state = engine.load_checkpoint(str(directory), tag=tag)
            if path is None:
                reason = "its files are missing"
        except TibnlpError as exc:
            if not _unreadable(exc):
                raise
            reason = exc.message
        except RuntimeError as exc:  # read, but weights of another shape: no older one fits
            if "Error(s) in loading state_dict" not in str(exc):
                raise
            detail = next((ln.strip() for ln in str(exc).splitlines()[1:] if ln.strip()), "")
            raise TibnlpError(
                f"checkpoint {directory / tag} holds another model than this run builds ({detail})",
                "resume with the settings the run was saved with (its config.yaml), or set "
                "pretrain.output to a new folder",
            ) from None
        # every rank moves on together, or their collectives would no longer pair up
        outcomes = all_gather_objects(reason)
        failed = [(rank, why) for rank, why in enumerate(outcomes) if why]
        if not failed:
            return tag, client_state
        rank, why = failed[0]
        where = f" (rank {rank})" if len(outcomes) > 1 else ""
        if n == len(tags) - 1:
            raise TibnlpError(
                f"no checkpoint in {directory} can be read: the oldest, {tag}, fails{where}: {why}",
                "run without --resume to start again, or restore the checkpoint files",
            )
        if is_main:
            _warn(
                f"checkpoint {directory / tag} cannot be read{where} ({why}); resuming from "
                f"the older {tags[n + 1]}"
            )
    return None


def _stage(engine: Any) -> int:
    return int(getattr(engine, "zero_optimization_stage", lambda: 0)())


def _processes(engine: Any) -> int:
    return int(getattr(engine, "dp_world_size", 1))


def _saved_partitions(folder: Path) -> int:
    """How many processes' optimizer partitions the checkpoint in `folder` was saved as (0:
    ZeRO stage 0, one file). Read from its layout record; a checkpoint from before the record
    is judged by its highest shard's rank. A shard lost since does not change the answer, so
    DeepSpeed's load fails on it and `load` moves on to an older checkpoint."""
    try:
        layout = json.loads((folder / LAYOUT).read_text(encoding="utf-8"))
        return int(layout["processes"]) if layout["zero_stage"] else 0
    except (OSError, ValueError, KeyError, TypeError):
        ranks = [int(m.group(1)) for p in folder.iterdir() if (m := _SHARD.match(p.name))]
        return max(ranks) + 1 if ranks else 0


def _require_same_partitions(engine: Any, folder: Path) -> None:
    """ZeRO stages 1 and 2 save the optimizer state as one partition per process, stage 0
    as one file. DeepSpeed loads neither into the other layout nor partitions into another
    process count: it stops with a traceback deep in its load. Said here in terms of the run
    (the files are the same on every rank, so every rank decides alike)."""
    stage, saved, world = _stage(engine), _saved_partitions(folder), _processes(engine)
    if bool(stage) != bool(saved):
        was = "1 or 2 (its config.yaml says which)" if saved else "0"
        raise TibnlpError(
            f"--resume: checkpoint {folder} was written with engine.zero_stage {was}; this run "
            f"has engine.zero_stage {stage}, whose optimizer state is laid out otherwise",
            f"resume with engine.zero_stage {was}",
        )
    if stage and saved != world:
        raise TibnlpError(
            f"--resume: checkpoint {folder} holds the optimizer state of engine.zero_stage "
            f"{stage} split over {saved} processes; this run has {world}",
            f"resume with {saved} processes (`torchrun --nproc_per_node {saved}` on one node)",
        )


def _unreadable(exc: TibnlpError) -> bool:
    """A file cut short or missing, not one torch's weights-only loader refused as unsafe."""
    cause = exc.__cause__
    return not (
        isinstance(cause, pickle.UnpicklingError) and "Weights only load failed" in str(cause)
    )


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)
