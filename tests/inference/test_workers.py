"""Several uvicorn worker processes: every scrape of /metrics counts every worker's requests, on the API port and on
PROMETHEUS_PORT (served by the process that starts the workers)."""

from __future__ import annotations

import os
import re
import signal
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.processes import free_port
from tests.helpers.service import Server, wait_for

pytestmark = pytest.mark.slow


def samples(text: str) -> dict[tuple, float]:
    """Every sample as prometheus-client's own parser reads it (it names counter samples `<name>_total`)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_two_workers_count_into_one_set_of_metrics(smoke_checkpoint):
    metrics_port = free_port()
    server = Server(
        smoke_checkpoint,
        *("--workers", "2", "--dtype", "float32", "--reload_interval_s", "0", "--prometheus_port", str(metrics_port)),
    ).wait_ready()
    try:
        deadline = time.time() + 90
        while server.output().count("Ready:") < 2:  # both workers loaded their model
            assert time.time() < deadline and server.process.poll() is None, server.output()
            time.sleep(0.2)
        requests = 40
        for i in range(requests):  # a new connection each time: the kernel hands them to either worker
            with httpx.Client(base_url=server.url) as client:
                assert (
                    client.post("/predict", json={"inputs": [[f"stocks fell {i}"], ["the yankees won"]]}).status_code
                    == 200
                )
        assert httpx.post(f"{server.url}/predict", json={"inputs": ""}).status_code == 400
        scrapes = [samples(httpx.get(f"{server.url}/metrics").text) for _ in range(8)]
        private = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics")
        assert private.headers["content-type"].startswith("text/plain; version=0.0.4")
        scrapes.append(samples(private.text))  # the same counts from the private port
        assert httpx.get(f"http://127.0.0.1:{metrics_port}/predict").status_code == 404  # metrics only
        workers = set()
        for scrape in scrapes:
            assert scrape[("te_request_success_total", (("method", "batch"),))] == requests
            assert scrape[("te_request_count_total", (("method", "batch"),))] == requests
            assert scrape[("te_request_failure_total", (("err", "empty"),))] == 1
            assert scrape[("te_batch_next_size_count", ())] >= 1
            workers |= {dict(labels)["pid"] for name, labels in scrape if name == "te_process_resident_memory_bytes"}
        assert len(workers) == 2, "expected both workers' process metrics"
        killed = sorted(workers)[0]  # a worker SIGKILLed (the OOM killer's way) never drops its own live gauges
        os.kill(int(killed), signal.SIGKILL)

        def pids() -> set[str]:
            scrape = samples(httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text)
            return {dict(labels)["pid"] for name, labels in scrape if name == "te_process_resident_memory_bytes"}

        assert killed not in wait_for(pids, lambda found: killed not in found, timeout=30)
    finally:
        output = server.stop()
    assert server.process.returncode == 0
    answered = re.findall(r"pid (\d+) \[\w+\] [\d.:]+ - \"POST /predict", output)
    assert len(answered) == requests + 1 and set(answered) == workers, "both workers must have answered requests"
