"""CUDA graph capture as serving and training both do it: eager warm-up passes on a side stream (lazy
initialisation must not be captured), then the capture into a memory pool the caller's graphs share. Serving
captures forward passes (inference/graphs.py), training whole steps (training/speed/step_graph.py); their CPU stand-ins
(tests/helpers/cuda_graphs) replace the callers' classes, not this."""

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
    # thread_local: a serving reload captures while the model thread still replays the old model's graphs
    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
        output = run()
    return graph.replay, output
