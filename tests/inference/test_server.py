"""The service as a real uvicorn process on 127.0.0.1: concurrency without cross-talk, graceful SIGTERM."""

from __future__ import annotations

import random
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.inference.conftest import Server

pytestmark = pytest.mark.slow

SUBJECTS = ["the yankees", "oil prices", "nasa", "the prime minister", "google", "the central bank", "federer",
            "rebels", "the chipmaker", "wall street"]
VERBS = ["beat", "fell", "launched", "signed", "released", "cut", "won", "rejected", "unveiled", "rose"]


def distinct_texts(client: int, count: int) -> list[str]:
    rng = random.Random(client)
    return [f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {' '.join(rng.choices(SUBJECTS + VERBS, k=rng.randint(1, 25)))} "
            f"client {client} request {i}" for i in range(count)]


def test_64_concurrent_clients_each_get_their_own_answers(smoke_checkpoint, reference):
    server = Server(smoke_checkpoint, "--precision", "fp32", "--max_wait_ms", "5").wait_ready()
    try:
        clients, per_client = 64, 20
        texts = {c: distinct_texts(c, per_client) for c in range(clients)}
        expected = {c: reference.scores(texts[c]) for c in range(clients)}
        failures: list[str] = []

        def run_client(c: int) -> None:
            with httpx.Client(base_url=server.url, timeout=60) as http:
                for i, text in enumerate(texts[c]):
                    body = {"inputs": text} if i % 2 else {"inputs": [text, text.upper()]}  # singles and batches
                    response = http.post("/predict", json=body)
                    if response.status_code != 200:
                        failures.append(f"client {c} request {i}: {response.status_code} {response.text}")
                        continue
                    answer = response.json() if i % 2 else response.json()[0]
                    want = expected[c][i]
                    if answer[0]["label"] != max(want, key=want.get) or \
                            any(abs(p["score"] - want[p["label"]]) > 1e-4 for p in answer):
                        failures.append(f"client {c} request {i}: got {answer}, expected {want}")

        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(run_client, range(clients)))
        assert not failures, failures[:5]
        metrics = httpx.get(f"{server.url}/metrics").text
        assert f'predict_requests_total{{status="200"}} {clients * per_client}' in metrics
        batches = int(next(l for l in metrics.splitlines() if l.startswith("inference_batch_size_count")).split()[1])
        texts_served = float(next(l for l in metrics.splitlines() if l.startswith("inference_batch_size_sum")).split()[1])
        assert texts_served == clients * per_client * 1.5
        assert texts_served / batches > 2, "concurrent requests were not merged into micro-batches"
    finally:
        server.stop()


def test_sigterm_finishes_queued_requests_and_exits_0(smoke_checkpoint):
    # A long batching window keeps requests queued when SIGTERM arrives.
    server = Server(smoke_checkpoint, "--max_wait_ms", "1500", "--max_batch_size", "256").wait_ready()
    results: list[int] = []

    def call(i: int) -> None:
        response = httpx.post(f"{server.url}/predict", json={"inputs": f"request {i} about oil prices"}, timeout=30)
        results.append(response.status_code)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    time.sleep(0.7)  # all 12 are waiting inside the batching window
    server.process.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(30)
    assert server.process.wait(30) == 0
    assert results == [200] * 12
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{server.url}/health", timeout=2)


def test_quickstart_demo_serves_one_prediction_and_stops(smoke_checkpoint):
    """The last step of the README's first command."""
    import subprocess
    import sys

    from tests.conftest import ROOT, cli_env

    result = subprocess.run([sys.executable, "-m", "inference.demo", "--checkpoint_dir", str(smoke_checkpoint)],
                            cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "-> 200" in result.stderr and "Business" in result.stderr and "service stopped (exit code 0)" in result.stderr
