"""Timing on either device: synchronised wall clock, peak memory, the measured matmul peak, and
the GPU's busy share sampled through NVML while a block runs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: str, reps: int) -> float:
    """Seconds per call of `fn`, `reps` calls after the device is idle."""
    sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / reps


def matmul_peak(device: str, n: int) -> float:
    """FLOP/s of an n x n x n product (bf16 on CUDA, fp32 on CPU): the MFU denominator, measured
    on the machine at hand rather than taken from a datasheet."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    return 2 * n**3 / timed(lambda: a @ b, device, 10)


def peak_memory(step: Callable[[], Any], device: str) -> float:
    """MiB the device held at the peak of one `step` (weights, optimizer state, activations);
    on CPU this is not measured per model (processes share one heap): NaN."""
    if device != "cuda":
        return float("nan")
    sync(device)
    torch.cuda.reset_peak_memory_stats()
    step()
    sync(device)
    return torch.cuda.max_memory_allocated() / 2**20


@contextmanager
def busy_share(device: str, every_s: float = 0.2) -> Iterator[dict[str, float]]:
    """NVML's utilisation (share of time a kernel was running) sampled while the block runs;
    `result["busy"]` is its mean, `result["idle"]` 1 - busy. NaN on CPU or without NVML."""
    result = {"busy": float("nan"), "idle": float("nan"), "samples": 0.0}
    handle = None
    if device == "cuda":
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        except Exception:  # no NVML: the figure stays NaN and says so in the table
            handle = None
    samples: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(every_s):
            samples.append(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0)

    thread = threading.Thread(target=sample, daemon=True) if handle is not None else None
    if thread:
        thread.start()
    try:
        yield result
    finally:
        stop.set()
        if thread:
            thread.join()
        if samples:
            result["busy"] = sum(samples) / len(samples)
            result["idle"] = 1.0 - result["busy"]
            result["samples"] = float(len(samples))
