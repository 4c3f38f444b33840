"""Training speed as users and bench/train_bench.py read it: examples/s, tokens/s, padding, peak memory. Called by the
loop.
"""

from __future__ import annotations

import resource
import time
from contextlib import contextmanager

import torch
from accelerate import Accelerator

from training.speed import packing


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory: GPU allocated, else CPU resident."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


class SteadyWindow:
    """Steady steps' time on the device's clock: CUDA events read once at the end, no per-step sync."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.stretches: list[tuple] = []  # (start, end) marks
        self._start = None

    def _mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def step(self, steady: bool) -> None:
        """Called before each step."""
        if steady and self._start is None:
            self._start = self._mark()
        elif not steady:
            self.close()

    @property
    def open(self) -> bool:
        """Inside a stretch of steady steps."""
        return self._start is not None

    def close(self) -> None:
        if self._start is not None:
            self.stretches.append((self._start, self._mark()))
            self._start = None

    def seconds(self) -> float:
        self.close()
        if self.cuda:
            torch.cuda.synchronize()
            return sum(start.elapsed_time(end) for start, end in self.stretches) / 1000
        return sum(end - start for start, end in self.stretches)


class Throughput:
    def __init__(self, device: torch.device):
        self.device = device
        self.tokens = torch.zeros((), dtype=torch.long, device=device)  # non-padding tokens trained on
        self.slots = 0  # token positions including padding
        self.examples = 0
        self.started = time.perf_counter()
        self.paused_s = 0.0
        self.window = SteadyWindow(device)
        self.steady_tokens = torch.zeros((), dtype=torch.long, device=device)
        self.steady_examples = 0

    def begin_step(self, steady: bool) -> None:
        self.window.step(steady)

    def observe(self, batch: dict) -> None:
        if packing.STARTS in batch:  # one packed row (training/speed/packing.py)
            real, examples = packing.real_tokens(batch), batch[packing.STARTS].shape[0] - 1
        else:
            real, examples = batch["attention_mask"].sum(), batch["attention_mask"].shape[0]
        self.tokens += real
        self.slots += batch["input_ids"].numel()
        self.examples += examples
        if self.window.open:
            self.steady_tokens += real
            self.steady_examples += examples

    @contextmanager
    def paused(self):
        """Evaluation and saves are not training time."""
        self.window.close()
        start = time.perf_counter()
        try:
            yield
        finally:
            self.paused_s += time.perf_counter() - start

    def summary(self, accelerator: Accelerator) -> dict:
        """A collective: world totals, rates over training time."""
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
            **self.steady_summary(accelerator),
            "train_seconds": round(seconds, 3),
            "examples": int(examples),
            "examples_per_second": examples / seconds,
            "tokens_per_second": tokens / seconds,
            "padding_fraction": 1 - tokens / slots if slots else 0.0,
            "peak_memory_mb_per_process": peak.item(),
        }

    def steady_summary(self, accelerator: Accelerator) -> dict:
        """The steady window's rates, slowest rank's."""
        window = torch.tensor([self.window.seconds()], dtype=torch.float64, device=self.device)
        seconds = max(accelerator.gather(window).max().item(), 1e-9)
        counts = [self.steady_tokens.double(), torch.tensor(float(self.steady_examples), device=self.device)]
        tokens, examples = accelerator.reduce(torch.stack(counts), reduction="sum").tolist()
        return {
            "steady": {
                "seconds": round(seconds, 3),
                "examples": int(examples),
                "examples_per_second": examples / seconds if examples else 0.0,
                "tokens_per_second": tokens / seconds if examples else 0.0,
            }
        }
