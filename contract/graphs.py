"""CUDA graph capture for serving (inference/engine/captured.py) and training (speed/step_graph.py): warm-up on a side
stream, then capture into a shared memory pool.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def capture(run: Callable[[], Any], device: torch.device, pool, warm_up_passes: int) -> tuple[Callable[[], None], Any]:
    """(replay, what `run` returned while captured: each replay rewrites it)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warm_up_passes):
            run()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # per thread: a reload captures while the old graphs still replay
    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
        output = run()
    return graph.replay, output
