"""A batched function mapped over a dataset in worker processes, stoppable at any moment.

`datasets.map(num_proc=N)` runs a `multiprocess` pool. Stopped mid-map (Ctrl-C, or SIGTERM to
the process group as `timeout` and systemd send it), its workers died, the pool forked new
ones that waited for good on a queue lock a dead one held, and the pool's terminate waited
for them: `tibnlp corpus prepare` hung (2 of 5 tries) or ended in pages of traceback with
exit 1. Here each worker is a plain forked process that maps one contiguous shard into an
Arrow file of its own, as `datasets` does, sharing nothing but a row count per worker
(no lock a killed worker could keep); a stop kills them all and leaves as it came (Ctrl-C's
130, SIGTERM's 143), and a worker whose parent is killed outright stops too (Linux). The
workers are forked before the progress bar's thread starts (a lock held by a thread at the
fork stays held in the child). The shards are concatenated in order, so the result is the
single-process map's.
"""

from __future__ import annotations

import multiprocessing
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datasets
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)

from tibnlp.stopping import ctrl_c_held, die_with_parent

POLL_S = 0.2  # how often the parent looks at its workers and updates the bar
# `map_batches`' function, fn_kwargs, batch_size, writer_batch_size, remove_columns, features:
# what each worker's `Dataset.map` is given
_Settings = tuple[Callable[..., dict[str, list[Any]]], dict[str, Any], int, int, list[str], Any]


def map_batches(
    data: datasets.Dataset,
    function: Callable[..., dict[str, list[Any]]],
    fn_kwargs: dict[str, Any],
    procs: int,
    work: Path,
    description: str,
    progress: bool,
    *,
    batch_size: int,
    writer_batch_size: int,
    remove_columns: list[str],
    features: datasets.Features | None = None,
    fingerprint: str | None = None,
) -> datasets.Dataset:
    """`data.map(function, batched=True, ...)` into `work`: over `min(procs, rows)` processes
    (`_map_in_processes`) when that is more than one, else in this process (`datasets`' own
    bar, shown as its progress bars are set). The same rows either way; `fingerprint`, when
    given, is the result's whatever the process count."""
    procs = min(procs, len(data))
    if procs > 1:
        settings = (function, fn_kwargs, batch_size, writer_batch_size, remove_columns, features)
        return _map_in_processes(data, procs, work, description, progress, settings, fingerprint)
    return data.map(
        function,
        batched=True,
        batch_size=batch_size,
        writer_batch_size=writer_batch_size,
        remove_columns=remove_columns,
        features=features,
        fn_kwargs=fn_kwargs,
        cache_file_name=str(work / "mapped.arrow"),
        load_from_cache_file=False,
        new_fingerprint=fingerprint,
        desc=description,
    )


def _map_in_processes(
    data: datasets.Dataset,
    procs: int,
    work: Path,
    description: str,
    progress: bool,
    settings: _Settings,
    fingerprint: str | None,
) -> datasets.Dataset:
    """`map_batches` (its `settings`) over `procs` forked processes, each writing
    `work/mapped-NNNNN.arrow`; rows in `data`'s order. A bar shows rows, rate and ETA.
    `fingerprint`: the result's (`datasets` cannot hash the counting wrapper, so without it
    the result's fingerprint names the shard files, the same for any input)."""
    ctx = multiprocessing.get_context("fork")
    done = ctx.RawArray("q", procs)  # rows mapped so far, one slot per worker
    paths = [work / f"mapped-{i:05d}.arrow" for i in range(procs)]
    arm = die_with_parent()  # (made here: it notes this process as the parent)
    workers = [
        ctx.Process(
            target=_map_shard, args=(data, i, procs, path, done, settings, arm), daemon=True
        )
        for i, path in enumerate(paths)
    ]
    bar = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeRemainingColumn(),
        console=Console(stderr=True),  # a log, not the command's output: stdout stays clean
        disable=not progress,
    )
    try:
        began = time.monotonic()
        with ctrl_c_held():  # (till each worker ignores it, its first act)
            for worker in workers:  # before the bar's refresh thread exists
                worker.start()
        with bar:
            task = bar.add_task(description, total=len(data), rate="")
            while any(w.is_alive() for w in workers):
                time.sleep(POLL_S)
                rows = sum(done)
                rate = rows / max(time.monotonic() - began, 1e-9)
                bar.update(task, completed=rows, rate=f"{rate:,.0f} rows/s")
            bar.update(task, completed=sum(done))
    except BaseException:  # a stop (or an error here): no worker outlives it
        for worker in workers:
            if worker.is_alive():
                worker.kill()
        for worker in workers:
            if worker.pid is not None:
                worker.join()
        raise
    for i, worker in enumerate(workers):
        if worker.exitcode != 0:
            how = (
                f"was killed by signal {-worker.exitcode}"
                if worker.exitcode is not None and worker.exitcode < 0
                else f"failed (exit {worker.exitcode}; its error is above)"
            )
            raise RuntimeError(f"{description}: worker {i} of {procs} {how}")
    mapped = datasets.concatenate_datasets([datasets.Dataset.from_file(str(p)) for p in paths])
    mapped.reset_format()  # unformatted, as `map` returns it (concatenation names the columns)
    if fingerprint is not None:
        mapped._fingerprint = fingerprint
    return mapped


def _map_shard(
    data: datasets.Dataset,
    index: int,
    count: int,
    path: Path,
    done: Any,
    settings: _Settings,
    arm: Callable[[], None] | None,
) -> None:
    """One worker: shard `index` of `count` (contiguous) mapped into `path`; its rows
    counted in `done[index]`."""
    if arm is not None:
        arm()  # SIGTERM when the parent dies, even by SIGKILL
    # Ctrl-C at the terminal reaches every process of the group: the parent stops the
    # workers, so a worker does not stop (or print a traceback) on its own
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    datasets.disable_progress_bars()  # (the parent's bar counts every worker's rows)
    function, fn_kwargs, batch_size, writer_batch_size, remove_columns, features = settings

    def counted(batch: dict[str, list[Any]], **kwargs: Any) -> dict[str, list[Any]]:
        out = function(batch, **kwargs)
        done[index] += len(next(iter(batch.values())))  # (this worker's slot alone)
        return out

    data.shard(count, index, contiguous=True).map(
        counted,
        batched=True,
        batch_size=batch_size,
        writer_batch_size=writer_batch_size,
        remove_columns=remove_columns,
        features=features,
        fn_kwargs=fn_kwargs,
        cache_file_name=str(path),
        load_from_cache_file=False,
        new_fingerprint=f"mapped-{index:05d}",  # (`counted` cannot be hashed: no warning)
    )
