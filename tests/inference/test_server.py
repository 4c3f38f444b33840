"""The service as a real uvicorn process on 127.0.0.1: concurrency without cross-talk, graceful SIGTERM."""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.helpers.service import Server, wait_for

pytestmark = pytest.mark.slow

SUBJECTS = [
    "the yankees",
    "oil prices",
    "nasa",
    "the prime minister",
    "google",
    "the central bank",
    "federer",
    "rebels",
    "the chipmaker",
    "wall street",
]
VERBS = ["beat", "fell", "launched", "signed", "released", "cut", "won", "rejected", "unveiled", "rose"]


def distinct_texts(client: int, count: int) -> list[str]:
    rng = random.Random(client)
    return [
        f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {' '.join(rng.choices(SUBJECTS + VERBS, k=rng.randint(1, 25)))} "
        f"client {client} request {i}"
        for i in range(count)
    ]


def test_64_concurrent_clients_each_get_their_own_answers(smoke_checkpoint, reference):
    server = Server(smoke_checkpoint, "--dtype", "float32", "--max_wait_ms", "5").wait_ready()
    try:
        clients, per_client = 64, 20
        texts = {c: distinct_texts(c, per_client) for c in range(clients)}
        expected = {c: reference.scores(texts[c]) for c in range(clients)}
        failures: list[str] = []

        def run_client(c: int) -> None:
            with httpx.Client(base_url=server.url, timeout=60) as http:
                for i, text in enumerate(texts[c]):
                    body = {"inputs": text} if i % 2 else {"inputs": [[text], [text.upper()]]}  # singles and batches
                    response = http.post("/predict", json=body)
                    if response.status_code != 200:
                        failures.append(f"client {c} request {i}: {response.status_code} {response.text}")
                        continue
                    answer = response.json() if i % 2 else response.json()[0]
                    want = expected[c][i]
                    if answer[0]["label"] != max(want, key=want.get) or any(
                        abs(p["score"] - want[p["label"]]) > 1e-4 for p in answer
                    ):
                        failures.append(f"client {c} request {i}: got {answer}, expected {want}")

        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(run_client, range(clients)))
        assert not failures, failures[:5]
        metrics = httpx.get(f"{server.url}/metrics").text

        def value(name: str) -> float:
            return float(next(row for row in metrics.splitlines() if row.startswith(name + " ")).split()[1])

        assert (
            value('te_request_success{method="single"}') + value('te_request_success{method="batch"}')
            == clients * per_client
        )
        batches, texts_served = value("te_batch_next_size_count"), value("te_batch_next_size_sum")
        assert texts_served == clients * per_client * 1.5
        assert texts_served / batches > 2, "concurrent requests were not merged into micro-batches"
    finally:
        server.stop()


def test_sigterm_finishes_in_flight_requests_and_exits_0(slow_checkpoint):
    # A grace period far above the work in flight: a slow CI machine must not turn this into a timing test.
    server = Server(
        # BACKEND torch: the drain is under test, not the runtime race (measuring a full-size model takes minutes)
        slow_checkpoint,
        "--backend",
        "torch",
        "--dtype",
        "float32",
        "--reload_interval_s",
        "0",
        "--graceful_shutdown_s",
        "600",
    ).wait_ready()
    results: list[int] = []
    long_text = " ".join(SUBJECTS * 60)  # truncated to 512 tokens

    def call(i: int) -> None:
        response = httpx.post(f"{server.url}/predict", json={"inputs": [[f"{i} {long_text}"]] * 4}, timeout=120)
        results.append(response.status_code)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    # All four received; 16 texts x 512 tokens: the forward passes take several seconds on a 2-core CPU
    wait_for(lambda: metric(server, "te_request_count", 'method="batch"'), lambda n: n == 4)
    started = time.time()
    server.process.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(300)
    assert server.exit_code(60) == 0, server.output()
    assert results == [200] * 4, server.output()
    assert time.time() - started > 1.0, "requests had already finished: the test proved nothing"
    assert "Shutting down" in server.output()
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{server.url}/health", timeout=2)


def test_sigterm_during_a_long_tokenize_answers_it_and_exits_0_without_a_traceback(smoke_checkpoint):
    """SIGTERM during a long /tokenize: answered, thread stopped, exit 0."""
    server = Server(smoke_checkpoint, "--reload_interval_s", "0", "--graceful_shutdown_s", "0.2").wait_ready()
    limit = httpx.get(f"{server.url}/info").json()["max_input_length"] * 250
    batch = [("word " * limit)[: limit - 1]] * 15
    answered: list[int] = []
    call = threading.Thread(
        target=lambda: answered.append(
            httpx.post(f"{server.url}/tokenize", json={"inputs": batch}, timeout=120).status_code
        )
    )
    call.start()
    time.sleep(0.5)  # the body is on its way or read; the tokens take seconds
    server.process.send_signal(signal.SIGTERM)
    assert server.exit_code(60) == 0, server.output()
    call.join(60)
    assert answered and answered[0] in (200, 503), (answered, server.output())
    assert "Traceback" not in server.output()


def test_quickstart_demo_serves_one_prediction_and_stops(smoke_checkpoint):
    """The last step of the README's first command."""
    import subprocess
    import sys

    from tests.helpers.processes import ROOT, cli_env

    result = subprocess.run(
        [sys.executable, "-m", "inference.demo", "--model_id", str(smoke_checkpoint)],
        cwd=ROOT,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        "-> 200" in result.stderr and "Business" in result.stderr and "service stopped (exit code 0)" in result.stderr
    )


def test_port_in_use_is_one_line_instead_of_hanging(smoke_checkpoint):
    """A taken port ends the process."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = Server(smoke_checkpoint, "--reload_interval_s", "0", port=port)
        assert server.exit_code(60) == 2, server.output()
    said = f"inference: error: PORT: cannot listen on 127.0.0.1:{port} (Address already in use)"
    assert server.output().strip() == said


def another_thread(pid: int) -> int:
    """A thread id of `pid` other than its main thread's (Linux: /proc/<pid>/task)."""
    others = sorted(int(tid) for tid in os.listdir(f"/proc/{pid}/task") if int(tid) != pid)
    assert others, "expected the service to run uvicorn on a second thread"
    return others[0]


@pytest.mark.parametrize(
    "sig, to_another_thread",
    [
        (signal.SIGINT, False),
        pytest.param(
            signal.SIGTERM,
            True,
            marks=pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread ids from /proc (Linux)"),
        ),
    ],
    ids=["sigint", "sigterm-taken-by-another-thread"],
)
def test_a_signal_drains_an_idle_service_and_exits_0(smoke_checkpoint, sig, to_another_thread):
    """A signal on any thread still drains the idle service."""
    server = Server(smoke_checkpoint, "--reload_interval_s", "0").wait_ready()
    assert httpx.post(f"{server.url}/predict", json={"inputs": "Stocks fell."}).status_code == 200
    os.kill(another_thread(server.process.pid) if to_another_thread else server.process.pid, sig)
    assert server.exit_code(30) == 0, server.output()
    assert "Shutting down" in server.output()


def test_a_client_that_leaves_is_counted_499_without_a_traceback(server):
    """Over a raw socket: one client leaves mid-body, one right after sending a slow batch."""
    import socket

    host, port = "127.0.0.1", server.port
    body = json.dumps({"inputs": [[" ".join(["word"] * 400)]] * 32}).encode()
    for payload in (
        b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n{",
        b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body,
    ):
        with socket.create_connection((host, port)) as sock:
            sock.sendall(payload)
        time.sleep(0.2)

    def left() -> float:
        rows = [r for r in httpx.get(f"{server.url}/metrics").text.splitlines() if 'status="499"' in r]
        return float(rows[0].split()[-1]) if rows else 0.0

    deadline = time.time() + 30
    while left() < 2 and time.time() < deadline:
        time.sleep(0.2)
    assert left() == 2, httpx.get(f"{server.url}/metrics").text
    assert "Traceback" not in server.output() and " 500" not in server.output(), server.output()[-3000:]


def test_queued_requests_whose_clients_left_are_never_computed(slow_checkpoint):
    """Clients that leave are counted 499 and never computed."""

    server = Server(slow_checkpoint, "--backend", "torch", "--dtype", "float32", "--reload_interval_s", "0")
    server.wait_ready()
    try:
        long_text = " ".join(SUBJECTS * 60)  # truncated to 512 tokens: seconds of work on a 2-core CPU
        with ThreadPoolExecutor(1) as pool:
            busy = pool.submit(httpx.post, f"{server.url}/predict", json={"inputs": [[long_text]] * 8}, timeout=300)
            # the long batch is on the model
            wait_for(lambda: metric(server, "te_batch_next_size_count"), lambda n: n == 1)
            clients = queue_ten_clients(server)
            for sock in clients:
                sock.close()
            assert not busy.done(), "the long batch finished before the clients left: the test proved nothing"
            assert busy.result().status_code == 200
        deadline = time.time() + 30
        while metric(server, "te_http_responses", 'status="499"') < 10 and time.time() < deadline:
            time.sleep(0.2)
        assert metric(server, "te_http_responses", 'status="499"') == 10, server.output()[-3000:]
        assert metric(server, "te_batch_next_size_sum") == 8, "texts of clients that had left were computed"
    finally:
        server.stop()


def queue_ten_clients(server: Server) -> list:
    """Ten clients of 4 texts each on raw sockets (each may leave at will), read and queued behind the batch on the
    model."""
    import socket

    clients = []
    for client in range(10):
        body = json.dumps({"inputs": [[text] for text in distinct_texts(client, 4)]}).encode()
        clients.append(socket.create_connection(("127.0.0.1", server.port)))
        clients[-1].sendall(
            b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
    wait_for(lambda: metric(server, "te_queue_size"), lambda n: n == 40)
    return clients


def metric(server: Server, name: str, labels: str = "") -> float:
    """One sample of the server's /metrics (0 when absent)."""
    for row in httpx.get(f"{server.url}/metrics").text.splitlines():
        if row.startswith(name) and labels in row and not row.startswith("#"):
            return float(row.split()[-1])
    return 0.0


def test_connections_are_bounded_and_idle_ones_closed(smoke_checkpoint):
    """MAX_CONNECTIONS (uvicorn's limit_concurrency): idle connections beyond it cannot starve the service of
    memory, new requests get 503 at once; KEEP_ALIVE_TIMEOUT_S closes an idle keep-alive connection."""
    import socket

    server = Server(
        smoke_checkpoint, "--reload_interval_s", "0", "--max_connections", "3", "--keep_alive_timeout_s", "1"
    ).wait_ready()
    try:

        def status() -> int:
            return httpx.post(f"{server.url}/predict", json={"inputs": "x"}).status_code

        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(3)]
        wait_for(status, lambda code: code == 503)  # once the service has taken the three idle connections
        for sock in idle:
            sock.close()
        wait_for(status, lambda code: code == 200)  # once it has seen them close
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
            sock.settimeout(5)
            started = time.time()
            assert sock.recv(4096) == b"", "the idle keep-alive connection should have been closed"
            assert time.time() - started < 3
    finally:
        server.stop()


def test_slow_clients_are_cut_at_the_read_timeout_and_probes_answer_beside_them(smoke_checkpoint):
    """Slow-header sockets past MAX_CONNECTIONS: probes answer, slow requests are cut."""
    import socket

    server = Server(
        smoke_checkpoint, "--reload_interval_s", "0", "--max_connections", "5", "--read_timeout_s", "6"
    ).wait_ready()
    slow = []
    try:
        body = b'{"inputs": "Stocks rallied"}'
        head = f"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
        trickle = socket.create_connection(("127.0.0.1", server.port))  # a whole head, then a body never sent
        trickle.sendall(head.encode() + b"\r\n\r\n" + body[:5])
        slow.append(trickle)
        for _ in range(8):  # past the limit: a head started, never finished
            sock = socket.create_connection(("127.0.0.1", server.port))
            sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            slow.append(sock)
        wait_for(lambda: httpx.post(f"{server.url}/predict", json={"inputs": "x"}).status_code, lambda c: c == 503)
        for probe in ("/health", "/ready", "/ping"):
            assert httpx.get(f"{server.url}{probe}").status_code == 200, probe  # beside the slow clients
        for sock in slow:  # each closed by the server within the timeout (and a margin for a busy machine)
            sock.settimeout(20)
        assert [sock.recv(4096) for sock in slow] == [b""] * len(slow)  # closed, nothing answered
        wait_for(lambda: httpx.post(f"{server.url}/predict", json={"inputs": "x"}).status_code, lambda c: c == 200)
        assert "did not arrive within 6s" in server.output()
    finally:
        for sock in slow:
            sock.close()
        server.stop()


def test_uvicorn_app_drains_then_ends_by_sigterm_as_documented(smoke_checkpoint):
    """docs/serving.md: `uvicorn inference.app:app_from_env --factory` re-raises SIGTERM after draining (exit status
    143 in a shell); `python -m inference` exits 0 (test_sigterm_finishes_in_flight_requests_and_exits_0)."""
    import subprocess
    import sys

    from tests.helpers.processes import ROOT, cli_env, free_port

    port = free_port()
    env = cli_env(MODEL_ID=str(smoke_checkpoint), RELOAD_INTERVAL_S="0")
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "inference.app:app_from_env", "--factory", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == -signal.SIGTERM, output
    assert "Application shutdown complete" in output and "Traceback" not in output
    assert " INFO inference " in output and "Ready: " in output  # the same start-up line as python -m inference
