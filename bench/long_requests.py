"""What long requests cost the model thread: a real `python -m inference` on a checkpoint of one output (so /rerank
answers), one big request at a time and, 0.15 s after it, a short /predict; each big request's total time, its
`x-tokenization-time` and `x-inference-time`, and how long the short one waited.

    python training/train.py --preset smoke-regression --output_dir /tmp/reranker
    python bench/long_requests.py /tmp/reranker

Not a CI test: it prints figures to record in docs/benchmarks.md (tests/training/test_problem_type_runs.py bounds
the same requests loosely).
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers.service import AG_NEWS, Server  # noqa: E402


def documents(seed: int):
    words = AG_NEWS.read_text().split()
    rng = random.Random(seed)

    def doc(chars: int) -> str:
        return " ".join(rng.choice(words) for _ in range(chars // 5))[:chars]

    return doc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a folder of one output (a reranker), e.g. the smoke-regression run")
    args = parser.parse_args()
    doc = documents(0)
    requests = {
        "/predict 32 documents of 60,000 characters": ("/predict", {"inputs": [[doc(60_000)] for _ in range(32)]}),
        "/predict 16 pairs of them": ("/predict", {"inputs": [[doc(60_000), doc(60_000)] for _ in range(16)]}),
        "/predict one input of 1.9 MB": ("/predict", {"inputs": doc(1_900_000)}),
        "/rerank a 1 MB query beside 32 texts": ("/rerank", {"query": doc(1_000_000), "texts": [doc(50)] * 32}),
    }
    server = Server(args.checkpoint, "--reload_interval_s", "0", "--backend", "torch").wait_ready()
    try:
        print("| request | total | tokenizing | inference | a short request meanwhile |")
        print("|---|---|---|---|---|")
        for name, (path, body) in requests.items():
            print(measure(server.url, name, path, body), flush=True)
    finally:
        server.stop()


def measure(url: str, name: str, path: str, body: dict) -> str:
    found = {}

    def big() -> None:
        started = time.perf_counter()
        response = httpx.post(url + path, json=body, timeout=300)
        found["big"] = (response, time.perf_counter() - started)

    thread = threading.Thread(target=big)
    thread.start()
    time.sleep(0.15)
    started = time.perf_counter()
    httpx.post(url + "/predict", json={"inputs": "Stocks fell."}, timeout=60)
    short = time.perf_counter() - started
    thread.join()
    response, total = found["big"]
    tokenizing, inference = response.headers["x-tokenization-time"], response.headers["x-inference-time"]
    return f"| {name} ({response.status_code}) | {total:.2f} s | {tokenizing} ms | {inference} ms | {short:.2f} s |"


if __name__ == "__main__":
    main()
