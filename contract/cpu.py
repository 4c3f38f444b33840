"""How busy this machine's cores are: what training's and the service's intra-op threads are chosen by (spinning
OpenMP threads on cores other programs hold cost more than fewer threads). Called by training/speed/cpu_speed.py and
inference/__main__.py. Imports no torch.
"""

from __future__ import annotations

import os
import time

LOAD_SAMPLE_S = 0.25  # sampling others' core use before choosing threads


def available_cores() -> int:
    """Cores this process may use."""
    if hasattr(os, "process_cpu_count"):  # Python 3.13+
        return os.process_cpu_count() or 1
    if hasattr(os, "sched_getaffinity"):  # Linux
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def busy_share(sample_s: float = LOAD_SAMPLE_S) -> float:
    """The share of our cores others kept busy over `sample_s` (Linux); 0 if unknown."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    before = _cpu_times(allowed)
    time.sleep(sample_s)
    after = _cpu_times(allowed)
    if not before or not after:
        return 0.0
    busy = [1 - (a[0] - b[0]) / max(a[1] - b[1], 1) for (a, b) in zip(after.values(), before.values())]
    return min(max(sum(busy) / len(busy), 0.0), 1.0)


def free_cores(cores: int, busy: float) -> int:
    """Threads for `cores` of which a `busy` share is held by others: at least one."""
    return max(1, min(cores, round(cores * (1 - busy))))


def _cpu_times(allowed: set[int] | None) -> dict[int, tuple[int, int]]:
    """{cpu: (idle, all ticks)} from /proc/stat."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            lines = [line.split() for line in fh if line.startswith("cpu") and line[3].isdigit()]
    except OSError:
        return {}
    times = {}
    for fields in lines:
        cpu, ticks = int(fields[0][3:]), [int(v) for v in fields[1:]]
        if allowed is None or cpu in allowed:
            times[cpu] = (ticks[3] + (ticks[4] if len(ticks) > 4 else 0), sum(ticks[:8]))  # idle + iowait; all
    return times
