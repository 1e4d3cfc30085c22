"""The cores lease.sh pins the part and `check` to: split from the cores this process may use
(its affinity, which a container's cpuset narrows), so the lease runs on any core count.

    eval "$(python3 -m benchmarks.gpu.cores)"   # PART_CPUS=0-9 CHECK_CPUS=10-15 CHECK_THREADS=6
"""

from __future__ import annotations

import os
from collections.abc import Iterable


def _cpu_list(cpus: list[int]) -> str:
    """taskset's list form: runs of consecutive ids as a-b, joined by commas."""
    runs: list[list[int]] = []
    for cpu in cpus:
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def split(cpus: Iterable[int]) -> tuple[str, str, int]:
    """(the part's cores, check's cores, check's thread count): check gets 3/8 of them (6 of
    the lent machines' 16, as measured beside the parts), the part the rest; with one core
    there is nothing to split (empty lists: no pinning)."""
    ordered = sorted(set(cpus))
    if len(ordered) < 2:
        return "", "", 1
    n_check = max(1, len(ordered) * 3 // 8)
    part, check = ordered[:-n_check], ordered[-n_check:]
    return _cpu_list(part), _cpu_list(check), n_check


def main() -> None:
    part, check, threads = split(os.sched_getaffinity(0))
    print(f"PART_CPUS={part} CHECK_CPUS={check} CHECK_THREADS={threads}")


if __name__ == "__main__":
    main()
