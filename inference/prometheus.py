"""Prometheus metrics under TEI's names, counted by prometheus-client. Routes, middleware and the engine count."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.utils import floatToGoString

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
DURATION_BUCKETS = tuple(0.00001 * 1.5**i for i in range(1, 36))  # TEI: 35 geometric buckets from 15 µs
BATCH_SIZE_BUCKETS = tuple(float(2**i) for i in range(13))
BATCH_TOKENS_BUCKETS = tuple(float(2**i) for i in range(21))
HOST_BUCKETS = tuple(0.00001 * 2**i for i in range(16))  # 20 us to 0.33 s


def multiprocess_dir() -> str | None:
    return os.environ.get(MULTIPROC_ENV) or os.environ.get(MULTIPROC_ENV.lower())


class Metrics:
    """One service's metrics, in a registry of its own."""

    def __init__(self, max_input_length: int = 512):
        self.registry = CollectorRegistry()
        reg = {"registry": self.registry}
        self.request_count = Counter(
            "te_request_count", "Requests received, by method (single or batch).", ["method"], **reg
        )
        self.request_success = Counter("te_request_success", "Requests answered, by method.", ["method"], **reg)
        self.request_failure = Counter("te_request_failure", "Requests failed, by reason.", ["err"], **reg)
        self.predict_count = Counter("te_predict_count", "Inputs handed to the model for classification.", **reg)
        self.predict_success = Counter("te_predict_success", "Inputs classified.", **reg)
        self.request_duration = self._duration("te_request_duration", "Time to answer a request (s).")
        self.tokenization_duration = self._duration("te_request_tokenization_duration", "Tokenization time (s).")
        self.queue_duration = self._duration("te_request_queue_duration", "Time waiting for the model (s).")
        self.inference_duration = self._duration("te_request_inference_duration", "Forward-pass time (s).")
        self.input_length = Histogram(
            "te_request_input_length",
            "Tokens per input.",
            buckets=tuple(float(2**i) for i in range(20) if 2**i <= max_input_length),
            **reg,
        )
        self.queue_size = Gauge("te_queue_size", "Inputs waiting for the model.", multiprocess_mode="livesum", **reg)
        self.batch_size = Histogram("te_batch_next_size", "Inputs per micro-batch.", buckets=BATCH_SIZE_BUCKETS, **reg)
        self.batch_tokens = Histogram(
            "te_batch_next_tokens", "Tokens per micro-batch.", buckets=BATCH_TOKENS_BUCKETS, **reg
        )
        self.responses = Counter(
            "te_http_responses",
            "Every HTTP request by the status its client saw (499: the client left before the answer).",
            ["status"],
            **reg,
        )
        self.reloads = Counter("te_model_reloads", "Checkpoint reloads, by result (ok or failed).", ["result"], **reg)
        self.watcher_up = Gauge(
            "te_checkpoint_watcher_up",
            "1 while each worker's checkpoint watcher (hot reload) runs; 0 once it has stopped.",
            multiprocess_mode="liveall",
            **reg,
        )
        self._process = ProcessCollector(registry=None)
        self._memory = Gauge(
            "te_process_resident_memory_bytes",
            "Resident memory of each worker process.",
            multiprocess_mode="liveall",
            **reg,
        )
        self._cpu = Gauge(
            "te_process_cpu_seconds", "CPU time of each worker process.", multiprocess_mode="liveall", **reg
        )
        self._process_read_at = 0.0
        self._engine_metrics(reg)

    def _engine_metrics(self, reg: dict) -> None:
        """What the engine's model thread does with its time: is the engine, not the model, the ceiling?"""
        self.engine_busy = Counter(
            "te_engine_busy_seconds",
            "Seconds the engine's model thread spent on micro-batches (rate: busy share).",
            **reg,
        )
        self.engine_busy_share = Gauge(
            "te_engine_busy_ratio",
            "Share of the last seconds the engine's model thread was busy; near 1 the engine is the ceiling.",
            multiprocess_mode="liveall",
            **reg,
        )
        self.engine_host = Histogram(
            "te_engine_host_duration",
            "Host time per micro-batch outside the forward passes: gathering, scoring, answering (s).",
            buckets=HOST_BUCKETS,
            **reg,
        )

    def _duration(self, name: str, text: str) -> Histogram:
        return Histogram(name, text, buckets=DURATION_BUCKETS, registry=self.registry)

    def record_process(self, min_interval_s: float = 1.0) -> None:
        """This process's memory and CPU (Linux)."""
        now = time.monotonic()
        if now - self._process_read_at < min_interval_s:
            return
        self._process_read_at = now
        for family in self._process.collect():
            for sample in family.samples:
                if sample.name == "process_resident_memory_bytes":
                    self._memory.set(sample.value)
                elif sample.name == "process_cpu_seconds_total":
                    self._cpu.set(sample.value)

    def exposition(self) -> str:
        """Every worker's metrics, or this process's."""
        self.record_process(min_interval_s=0)
        return all_workers_exposition() if multiprocess_dir() else render(self.registry)


def all_workers_exposition() -> str:
    """Every worker's metrics, summed from the multiprocess folder; a killed worker's live gauges dropped first."""
    forget_dead_workers(multiprocess_dir())
    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    return render(registry)


LIVE_GAUGE_FILE = re.compile(r"gauge_live\w+_(\d+)\.db")  # prometheus-client's names for a live gauge's file


def forget_dead_workers(folder: str | None) -> None:
    """A worker killed (SIGKILL, OOM) never ran worker_exited: its live gauges would be summed forever."""
    if not folder:
        return
    pids = {int(m.group(1)) for p in Path(folder).glob("gauge_live*_*.db") if (m := LIVE_GAUGE_FILE.fullmatch(p.name))}
    for pid in pids:
        try:
            os.kill(pid, 0)  # no signal sent: only whether the process exists
        except ProcessLookupError:
            mark_process_dead(pid, folder)
        except PermissionError:  # exists, another user's
            continue


def worker_exited() -> None:
    """Drop this worker's live gauges."""
    if multiprocess_dir():
        mark_process_dead(os.getpid())


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def render(registry: CollectorRegistry) -> str:
    """TEI's text format: counters without `_total`, no `_created`."""
    lines = []
    for family in registry.collect():
        lines.append(f"# HELP {family.name} {_escape(family.documentation)}")
        lines.append(f"# TYPE {family.name} {family.type}")
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            name = family.name if family.type == "counter" else sample.name
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(sample.labels.items()))
            value = floatToGoString(sample.value)
            lines.append(f"{name}{{{labels}}} {value}" if labels else f"{name} {value}")
    return "\n".join(lines) + "\n"
