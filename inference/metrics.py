"""A few Prometheus metrics in the text exposition format (no extra dependency for four series)."""

from __future__ import annotations

import threading
from collections import defaultdict


class Counter:
    def __init__(self, name: str, help_text: str, label: str):
        self.name, self.help, self.label = name, help_text, label
        self.values: dict[str, float] = defaultdict(float)
        self._lock = threading.Lock()

    def inc(self, label_value: str, amount: float = 1.0) -> None:
        with self._lock:
            self.values[label_value] += amount

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter"]
        with self._lock:
            lines += [f'{self.name}{{{self.label}="{k}"}} {v:g}' for k, v in sorted(self.values.items())]
        return lines


class Gauge:
    def __init__(self, name: str, help_text: str):
        self.name, self.help, self.value = name, help_text, 0.0

    def set(self, value: float) -> None:
        self.value = value

    def render(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} gauge", f"{self.name} {self.value:g}"]


class Histogram:
    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...]):
        self.name, self.help, self.buckets = name, help_text, buckets
        self.counts = [0] * len(buckets)
        self.total, self.count = 0.0, 0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        with self._lock:
            for i, bound in enumerate(self.buckets):
                if value <= bound:
                    self.counts[i] += 1
            self.total += value
            self.count += 1

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        with self._lock:
            lines += [f'{self.name}_bucket{{le="{b:g}"}} {c}' for b, c in zip(self.buckets, self.counts)]
            lines += [f'{self.name}_bucket{{le="+Inf"}} {self.count}', f"{self.name}_sum {self.total:g}",
                      f"{self.name}_count {self.count}"]
        return lines


class Metrics:
    def __init__(self) -> None:
        self.requests = Counter("predict_requests_total", "Requests to /predict by HTTP status.", "status")
        self.latency = Histogram("predict_request_duration_seconds", "Time to answer /predict.",
                                 (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self.batch_size = Histogram("inference_batch_size", "Texts per micro-batch (one or more forward passes).",
                                    (1, 2, 4, 8, 16, 32, 64, 128))
        self.queue_depth = Gauge("inference_queue_depth", "Texts waiting for the model.")
        self.reloads = Counter("model_reloads_total", "Checkpoint reloads by result.", "result")

    def render(self) -> str:
        series = (self.requests, self.latency, self.batch_size, self.queue_depth, self.reloads)
        return "\n".join(line for s in series for line in s.render()) + "\n"
