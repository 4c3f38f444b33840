"""The serving benchmarks' load generator: a server process started and awaited until every worker is ready, and
clients on raw keep-alive HTTP/1.1 streams sending one text per request, spread over load processes; requests/s,
p50 and p99 latency of the measured window."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STARTED = "Application startup complete."  # uvicorn logs it once per worker process


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def worker_count(cmd: list[str]) -> int:
    for flag in ("--workers", "--serve-null"):
        if flag in cmd:
            return int(cmd[cmd.index(flag) + 1])
    return 1


def start(cmd: list[str], url: str, log: Path, cwd: Path = ROOT) -> subprocess.Popen:
    """The server, once every worker process is ready: /ready answers from whichever worker takes the connection,
    so with several the log must also show each worker's 'Application startup complete.' (uvicorn's, at INFO)."""
    import httpx

    # the previous service runs from its own checkout, ahead of anything else on the path
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(cwd), os.environ.get("PYTHONPATH")]))}
    process = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    deadline = time.time() + 600  # the int8 peer quantizes at start
    while time.time() < deadline:
        if process.poll() is not None:
            sys.exit(f"{cmd} exited; see {log}")
        try:
            ready = httpx.get(f"{url}/ready", timeout=1).status_code == 200
        except httpx.TransportError:
            ready = False
        workers = worker_count(cmd)
        if ready and (workers == 1 or log.read_text(errors="replace").count(STARTED) >= workers):
            return process
        time.sleep(0.3)
    sys.exit(f"{cmd} not ready; see {log}")


class Connection:
    """A minimal HTTP/1.1 keep-alive client on asyncio streams. httpx's per-request Python cost, paid by a load
    generator that shares the server's cores, would be added to every latency it reports; this one's is a
    fraction of it."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port

    async def __aenter__(self) -> Connection:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def __aexit__(self, *exc) -> None:
        self.writer.close()

    async def post_json(self, path: str, payload) -> tuple[int, bytes]:
        body = json.dumps(payload).encode()
        self.writer.write(
            f"POST {path} HTTP/1.1\r\nhost: {self.host}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        head = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in head[1:] if ": " in line)
        return int(head[0].split()[1]), await self.reader.readexactly(int(headers["content-length"]))


async def drive(url: str, texts: list[str], clients: range, duration: float, start_at: float) -> tuple[list, int]:
    """Clients (numbered: each its own random texts) send one text per request back to back from `start_at` (wall
    clock) for 2 s of warm-up and `duration` s measured: (the measured latencies, the failed answers)."""
    host, port = url.removeprefix("http://").split(":")
    latencies: list[float] = []
    errors = 0
    await asyncio.sleep(max(0.0, start_at - time.time()))
    stop_at = time.perf_counter() + 2 + duration
    measure_from = time.perf_counter() + 2

    async def client(worker: int) -> None:
        nonlocal errors
        rng = random.Random(worker)
        async with Connection(host, int(port)) as http:
            while time.perf_counter() < stop_at:
                sent = time.perf_counter()
                status, answer = await http.post_json("/predict", {"inputs": rng.choice(texts)})
                if sent >= measure_from:
                    latencies.append(time.perf_counter() - sent)
                    errors += status != 200 or not json.loads(answer)

    await asyncio.gather(*(client(w) for w in clients))
    return latencies, errors


def drive_share(url: str, texts: list[str], clients: range, duration: float, start_at: float) -> tuple[list, int]:
    """One load process's share of the clients (a process pool's task)."""
    return asyncio.run(drive(url, texts, clients, duration, start_at))


def load(url: str, texts: list[str], concurrency: int, duration: float, processes: int) -> dict:
    """`concurrency` clients spread over `processes` load processes (one Python process cannot offer more than a few
    thousand requests/s: several, where the machine has the cores, keep the load generator from being the ceiling),
    all starting at once."""
    processes = max(1, min(processes, concurrency))
    shares = [range(concurrency)[p::processes] for p in range(processes)]
    start_at = time.time() + (1.5 if processes > 1 else 0.0)  # the pool's processes start meanwhile
    if processes == 1:
        parts = [drive_share(url, texts, shares[0], duration, start_at)]
    else:
        with concurrent.futures.ProcessPoolExecutor(processes) as pool:
            parts = list(pool.map(drive_share, *zip(*((url, texts, c, duration, start_at) for c in shares))))
    latencies = sorted(latency for part, _ in parts for latency in part)
    return {
        "rps": len(latencies) / duration,
        "p50": statistics.median(latencies) * 1000,
        "p99": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] * 1000,
        "errors": sum(errors for _, errors in parts),
        "n": len(latencies),
    }
