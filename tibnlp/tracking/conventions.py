"""What every run records about its origin: git commit and content hashes of what it was made from.

A run must be able to say exactly which code, data, vocabulary and parent model produced it, so
provenance is a set of tags computed the same way by every stage (and by the pipeline cache,
which addresses stage outputs by the same hashes).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from tibnlp.fsutil import walk_files

TAG_GIT_COMMIT = "tibnlp.git_commit"
TAG_DATA = "tibnlp.data_hash"
TAG_VOCAB = "tibnlp.vocab_hash"
TAG_PARENT_MODEL = "tibnlp.parent_model_hash"
TAG_MODEL = "tibnlp.model"  # short label of the model configuration, used to group runs
TAG_STAGE = "tibnlp.stage"
TAG_VARIANT = "tibnlp.variant"
TAG_PRETRAIN_RUN = "tibnlp.pretrain_run"  # the pretraining run a fine-tuned model came from
# the fine-tuning seed record (seed_result.json) a seed run reports: the same in the run that
# trained the seed and in every rerun that reports it again, so `runs compare` counts it once
TAG_SEED_RECORD = "tibnlp.seed_record"
# "majority_class": a fine-tuning stuck at that level; "not_learning": a pretraining at unigram
TAG_WARNING = "warning"
WARNING_MAJORITY = "majority_class"
# What a fine-tuning run records about the pretraining behind its encoder (params
# `pretrain.KEY`, from the model directory's metadata, `read_extra`), so a learning curve can
# place it by tokens, FLOPs or CPU-hours (train_seconds x processes / 3600).
PRETRAIN = "pretrain."
PRETRAIN_KEYS = ("step", "tokens", "train_seconds", "flops", "hardware", "processes")

_CHUNK = 1 << 20
_memo: dict[tuple[str, int, int], str] = {}


@lru_cache(maxsize=8)
def git_commit(cwd: Path | None = None) -> str:
    """Commit of the checkout holding the code (`+dirty` if modified), or "unknown"."""
    where = cwd or Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10
        )
        if out.returncode != 0:
            return "unknown"
        commit = out.stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return commit + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def file_hash(path: Path) -> str:
    """sha256 of a file, memoised on (path, size, mtime) so repeated runs do not re-read data."""
    path = Path(path)
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _memo:
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            while chunk := fh.read(_CHUNK):
                digest.update(chunk)
        _memo[key] = digest.hexdigest()
    return _memo[key]


def path_hash(path: Path) -> str:
    """sha256 of a file, or of a directory's relative file names and file hashes (sorted).

    Hidden bookkeeping files (names starting with '.') are ignored, so a directory's hash is
    that of its content, not of where or when it was written. Linked folders are followed, as
    the input readers do (`rglob` does not): a change in a file read through one reruns.
    """
    path = Path(path)
    if path.is_file():
        return file_hash(path)
    if not path.is_dir():
        raise FileNotFoundError(path)
    digest = hashlib.sha256()
    for rel in sorted(f.relative_to(path) for f in walk_files(path)):
        digest.update(f"{rel.as_posix()}\0{file_hash(path / rel)}\n".encode())
    return digest.hexdigest()


def config_hash(data: Any) -> str:
    """sha256 of a JSON-able structure with sorted keys (stable across runs and machines)."""
    text = json.dumps(data, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _hash_many(paths: Path | str | Iterable[Path | str]) -> str:
    if isinstance(paths, (str, Path)):
        return path_hash(Path(paths))
    hashes = [path_hash(Path(p)) for p in paths]
    return hashes[0] if len(hashes) == 1 else config_hash(hashes)


def provenance_tags(
    data: Path | str | Iterable[Path | str] | None = None,
    vocab: Path | str | None = None,
    parent_model: Path | str | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Tags naming the code commit and the content hashes of data, vocabulary, parent model.

    Arguments left out (or naming paths that do not exist) are simply not tagged, so a stage
    passes what it has: `provenance_tags(data=corpus_dir, vocab=vocab_dir)`.
    """
    tags = {TAG_GIT_COMMIT: git_commit()}
    if tags[TAG_GIT_COMMIT] != "unknown":
        tags["mlflow.source.git.commit"] = tags[TAG_GIT_COMMIT].removesuffix("+dirty")
    for tag, value in ((TAG_DATA, data), (TAG_VOCAB, vocab), (TAG_PARENT_MODEL, parent_model)):
        if value is None or value == "":
            continue
        try:
            tags[tag] = _hash_many(value)
        except FileNotFoundError:
            continue
    tags.update(extra or {})
    return tags


def pretrain_params(extra: Mapping[str, Any], random_init: bool) -> dict[str, Any]:
    """`pretrain.*` params of a fine-tuning run from its model directory's `extra` metadata.

    A random-init or from-scratch system has had no pretraining: 0 tokens, steps, seconds and
    FLOPs (the 0-token point of a learning curve), whatever directory its shape came from.
    """
    if random_init:
        return {f"{PRETRAIN}{k}": 0 for k in ("step", "tokens", "train_seconds", "flops")}
    return {f"{PRETRAIN}{k}": extra[k] for k in PRETRAIN_KEYS if k in extra}


def env_default(name: str, value: str) -> None:
    """Set an environment default without overriding the user's choice."""
    os.environ.setdefault(name, value)
