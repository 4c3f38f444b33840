"""Training speed as users (and bench/train_bench.py) read it: examples/s, real tokens/s, padding, peak memory.

Counts stay on the device during the epoch (no host sync per step); they are summed over ranks once, at the
end. Time spent evaluating and saving is excluded, so the figure is the training loop's own rate.
"""

from __future__ import annotations

import resource
import time
from contextlib import contextmanager

import torch
from accelerate import Accelerator


def peak_memory_mb(device: torch.device) -> float:
    """GPU: the most memory PyTorch allocated; CPU: the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


class Throughput:
    def __init__(self, device: torch.device):
        self.device = device
        self.tokens = torch.zeros((), dtype=torch.long, device=device)  # non-padding tokens trained on
        self.slots = 0  # token positions including padding
        self.examples = 0
        self.started = time.perf_counter()
        self.paused_s = 0.0

    def observe(self, batch: dict) -> None:
        mask = batch["attention_mask"]
        self.tokens += mask.sum()
        self.slots += mask.numel()
        self.examples += mask.shape[0]

    @contextmanager
    def paused(self):
        """Evaluation and checkpoint writes do not count as training time."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.paused_s += time.perf_counter() - start

    def summary(self, accelerator: Accelerator) -> dict:
        """All ranks together (a collective): totals over the world, rates over this run's training time."""
        totals = torch.stack(
            [
                self.tokens.double(),
                torch.tensor(float(self.slots), device=self.device),
                torch.tensor(float(self.examples), device=self.device),
            ]
        )
        tokens, slots, examples = accelerator.reduce(totals, reduction="sum").tolist()
        seconds = max(time.perf_counter() - self.started - self.paused_s, 1e-9)
        peak = accelerator.gather(torch.tensor([peak_memory_mb(self.device)], device=self.device)).max()
        return {
            "train_seconds": round(seconds, 3),
            "examples": int(examples),
            "examples_per_second": examples / seconds,
            "tokens_per_second": tokens / seconds,
            "padding_fraction": 1 - tokens / slots if slots else 0.0,
            "peak_memory_mb_per_process": peak.item(),
        }
