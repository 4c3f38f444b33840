"""What a refused 1.5-2 MB request costs the service, in CPU per request, against a small accepted /predict (the
peer, same run), and a one-text /predict's latency meanwhile. --before REF: the service at REF beside it.

    python training/train.py --preset smoke --output_dir /tmp/smoke
    python bench/refusal_cost.py /tmp/smoke --before 53a86bc

Not a CI test: it prints a markdown block to record in docs/benchmarks-log.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.serve_bench import checkout, machine  # noqa: E402
from tests.helpers.service import Server  # noqa: E402

CLIENTS = 2  # looping the request measured
SAMPLES = 60  # one-text /predict latencies per row
SEQUENTIAL = 200  # requests one after another, for the service's CPU per request


def requests(model_name: str) -> dict[str, tuple[str, bytes, dict]]:
    """name: (path, body, headers), the peer first."""
    as_json = {"content-type": "application/json"}
    blob = struct.pack("<I", 0) * 490_000
    tensor = {"name": "text", "shape": [490_000], "datatype": "BYTES", "parameters": {"binary_data_size": len(blob)}}
    head = json.dumps({"inputs": [tensor]}).encode()
    kserve = {"Inference-Header-Content-Length": str(len(head)), "content-type": "application/octet-stream"}
    small = json.dumps({"inputs": [["Stocks fell."], ["Rain is due."]]}).encode()
    texts = json.dumps({"input": [""] * 390_000}).encode()
    lists = json.dumps({"inputs": [[""]] * 240_000}).encode()
    return {
        "peer: a small accepted /predict (2 texts)": ("/predict", small, as_json),
        "KServe binary, 490,000 elements (1.96 MB)": (f"/v2/models/{model_name}/infer", head + blob, kserve),
        "/v1/classify, 390,000 texts (1.56 MB)": ("/v1/classify", texts, as_json),
        "/predict, 240,000 one-text lists (1.44 MB)": ("/predict", lists, as_json),
    }


def process_cpu_s(pid: int) -> float:
    """User and system CPU seconds of a process so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_per_request(server: Server, path: str, body: bytes, headers: dict) -> float:
    """The service's CPU ms per request, SEQUENTIAL of them one after another."""
    with httpx.Client(base_url=server.url, timeout=120) as client:
        for _ in range(5):  # warm
            client.post(path, content=body, headers=headers)
        before = process_cpu_s(server.process.pid)
        for _ in range(SEQUENTIAL):
            client.post(path, content=body, headers=headers)
        return (process_cpu_s(server.process.pid) - before) / SEQUENTIAL * 1000


def one_text_latency(url: str) -> float:
    """Median ms of a one-text /predict, SAMPLES times, 20 ms apart."""
    taken = []
    with httpx.Client(base_url=url, timeout=60) as client:
        for _ in range(SAMPLES):
            started = time.perf_counter()
            assert client.post("/predict", json={"inputs": "Stocks fell sharply."}).status_code == 200
            taken.append(time.perf_counter() - started)
            time.sleep(0.02)
    return statistics.median(taken) * 1000


def under_load(url: str, path: str, body: bytes, headers: dict) -> tuple[float, int, float]:
    """(one-text median ms, the looped request's status, its median ms) while CLIENTS loop it."""
    stop, seen = threading.Event(), []

    def loop() -> None:
        with httpx.Client(base_url=url, timeout=120) as client:
            while not stop.is_set():
                started = time.perf_counter()
                status = client.post(path, content=body, headers=headers).status_code
                seen.append((status, time.perf_counter() - started))

    threads = [threading.Thread(target=loop) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    try:
        latency = one_text_latency(url)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    return latency, seen[0][0], statistics.median(s for _, s in seen) * 1000


def measure(label: str, project: Path, checkpoint: str) -> None:
    """Every row for the service of `project` (this checkout, or another's folder)."""
    server = Server(checkpoint, "--reload_interval_s", "0", "--backend", "torch", cwd=project).wait_ready()
    try:
        print(f"| {label} | idle | - | - | - | {one_text_latency(server.url):.1f} ms | - |", flush=True)
        peer_cpu = peer_latency = None
        for name, (path, body, headers) in requests(checkpoint).items():
            cpu = cpu_per_request(server, path, body, headers)
            latency, status, own = under_load(server.url, path, body, headers)
            peer_cpu, peer_latency = peer_cpu or cpu, peer_latency or latency
            cells = [label, name, status, f"{cpu:.2f} ms ({cpu / peer_cpu:.2f}x)", f"{own:.1f} ms"]
            cells += [f"{latency:.1f} ms", f"{latency / peer_latency:.2f}x"]
            print("| " + " | ".join(map(str, cells)) + " |", flush=True)
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a checkpoint folder, e.g. the smoke run's")
    parser.add_argument("--before", help="a commit (or a folder holding the project) to measure the same way")
    args = parser.parse_args()
    checkpoint = str(Path(args.checkpoint).resolve())
    print(f"machine: {machine()}; {CLIENTS} clients looping each request")
    print(
        "| service | request | status | service CPU per request (vs the peer) | its median, 2 clients looping | "
        "one-text /predict meanwhile | vs the peer |"
    )
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as scratch:
        if args.before:
            measure(f"before ({args.before})", checkout(args.before, Path(scratch) / "before"), checkpoint)
        measure("this commit", ROOT, checkpoint)


if __name__ == "__main__":
    main()
