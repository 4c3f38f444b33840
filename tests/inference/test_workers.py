"""WORKERS > 1: one engine batches for every front-end."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from contract import files
from contract.loading import load_model
from inference.answers import Overloaded
from inference.engine.link_server import LinkServer
from inference.engine.scheduler import Engine, Limits
from inference.engine.service import Service
from inference.front_end.link import HEARTBEAT_S, RemoteLink
from inference.prometheus import Metrics
from inference.settings import Settings
from tests.helpers.files import save_new_weights
from tests.helpers.processes import free_port, graphs_env
from tests.helpers.service import Server, wait_for
from tests.inference.test_app import TEXTS
from tests.inference.test_client_families import by_label
from tests.inference.test_server import SUBJECTS, metric, queue_ten_clients

pytestmark = pytest.mark.slow
FRONT_ENDS = 4


def samples(text: str) -> dict[tuple, float]:
    """Every sample as prometheus-client's own parser reads it (it names counter samples `<name>_total`)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def front_ends_of(server: Server, count: int = FRONT_ENDS) -> list[int]:
    """The front-ends' pids: the engine's children that said they are ready."""
    wait_for(lambda: server.output().count("Front-end ready"), lambda n: n >= count, timeout=90)
    return [int(pid) for pid in re.findall(r"pid (\d+) \[-\] Front-end ready", server.output())]


def holds_torch(pid: int) -> bool:
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


# the GPU engine's path on the CPU: static shapes, the tokenizer thread, CUDA graphs through the stand-in
# (tests/helpers/cuda_graphs), captured in the engine's process only
CAPTURED = ("--dtype", "float32", "--backend", "torch", "--static_shapes", "--tokenizer_thread")


@pytest.fixture(scope="module")
def served(smoke_checkpoint):
    metrics_port = free_port()
    args = ("--workers", str(FRONT_ENDS), *CAPTURED, "--reload_interval_s", "0", "--prometheus_port", str(metrics_port))
    server = Server(smoke_checkpoint, *args, env=graphs_env()).wait_ready()
    yield server, metrics_port
    server.stop()


def texts(n: int) -> list[str]:
    words = "stocks fell the yankees won a new chip doubles battery life oil prices rose leaders met".split()
    return [" ".join(words[(i * 7 + j) % len(words)] for j in range(3 + i % 9)) for i in range(n)]


def test_one_process_holds_the_model_and_answers_as_one_process_does(served, smoke_checkpoint):
    """400 requests at concurrency 16 over 4 front-ends: the same answers as WORKERS=1 (1e-5), the engine's CUDA
    graphs captured and replayed once for all of them, and only the engine's process has torch loaded."""
    server, _ = served
    front_ends = front_ends_of(server)
    assert holds_torch(server.process.pid) and not any(holds_torch(pid) for pid in front_ends)
    assert server.output().count("Captured ") == 1, server.output()  # one capture, in the engine
    alone = Server(smoke_checkpoint, *CAPTURED, "--reload_interval_s", "0", env=graphs_env())
    alone.wait_ready()
    bodies = [{"inputs": [[t] for t in texts(400)[i : i + 4]]} for i in range(0, 400, 4)] * 4  # 400 requests

    def answers(url: str) -> list:
        with httpx.Client(base_url=url, timeout=60) as client, ThreadPoolExecutor(16) as pool:
            return list(pool.map(lambda body: client.post("/predict", json=body).json(), bodies))

    try:
        ours, one = answers(server.url), answers(alone.url)
    finally:
        alone.stop()
    assert len(ours) == 400
    for got, expected in zip(ours, one, strict=True):
        for row, reference in zip(got, expected, strict=True):
            assert [a["label"] for a in row] == [a["label"] for a in reference]
            assert all(abs(a["score"] - b["score"]) <= 1e-5 for a, b in zip(row, reference))
    answered = set(re.findall(r"pid (\d+) \[\w+\] [\d.:]+ - \"POST /predict", server.output()))
    assert len(answered) > 1 and answered <= {str(pid) for pid in front_ends}  # the front-ends answer


def test_every_process_counts_into_one_set_of_metrics(served):
    server, metrics_port = served
    front_ends_of(server)

    def counted() -> float:
        return samples(httpx.get(f"{server.url}/metrics").text).get(
            ("te_request_success_total", (("method", "batch"),)), 0
        )

    before = counted()
    requests = 40
    for i in range(requests):  # a new connection each time: the kernel hands them to any front-end
        with httpx.Client(base_url=server.url) as client:
            assert (
                client.post("/predict", json={"inputs": [[f"stocks fell {i}"], ["the yankees won"]]}).status_code == 200
            )
    assert httpx.post(f"{server.url}/predict", json={"inputs": ""}).status_code == 400
    scrapes = [samples(httpx.get(f"{server.url}/metrics").text) for _ in range(8)]
    private = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics")
    assert private.headers["content-type"].startswith("text/plain; version=0.0.4")
    scrapes.append(samples(private.text))  # the same counts from the private port
    assert httpx.get(f"http://127.0.0.1:{metrics_port}/predict").status_code == 404  # metrics only
    for scrape in scrapes:
        assert scrape[("te_request_success_total", (("method", "batch"),))] == before + requests
        assert scrape[("te_request_failure_total", (("err", "empty"),))] >= 1
        assert scrape[("te_batch_next_size_count", ())] >= 1  # counted by the engine, seen from every front-end


def test_the_other_client_families_answer_through_the_engine(served):
    """vLLM's classify and KServe v2 from the front-ends: the engine's scores, as /predict answers them."""
    server, _ = served
    labels = list(httpx.get(f"{server.url}/info").json()["model_type"]["classifier"]["id2label"].values())
    inputs = texts(6)
    predicted = httpx.post(f"{server.url}/predict", json={"inputs": [[t] for t in inputs]}).json()
    expected = [by_label(row, labels) for row in predicted]
    name = httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"]
    classified = httpx.post(f"{server.url}/v1/classify", json={"input": inputs}).json()["data"]
    tensor = {"name": "text", "shape": [len(inputs)], "datatype": "BYTES", "data": inputs}
    inferred = httpx.post(f"{server.url}/v2/models/{name}/infer", json={"inputs": [tensor]}).json()["outputs"][0]
    flat = [score for row in expected for score in row]
    assert [score for row in classified for score in row["probs"]] == pytest.approx(flat, abs=1e-5)
    assert inferred["shape"] == [len(inputs), len(labels)]
    assert inferred["data"] == pytest.approx(flat, abs=1e-5)


def test_the_limit_counts_every_front_end_and_clients_that_leave_are_never_computed(slow_checkpoint):
    """Across front-ends: 429 past the shared limit; leavers counted 499."""
    args = ("--workers", "2", "--backend", "torch", "--dtype", "float32", "--reload_interval_s", "0")
    server = Server(slow_checkpoint, *args, "--max_concurrent_requests", "48").wait_ready()
    front_ends_of(server, 2)
    try:
        long_text = " ".join(SUBJECTS * 60)  # truncated to 512 tokens: seconds of work on a 2-core CPU
        with ThreadPoolExecutor(1) as pool:
            busy = pool.submit(httpx.post, f"{server.url}/predict", json={"inputs": [[long_text]] * 8}, timeout=300)
            wait_for(lambda: metric(server, "te_batch_next_size_count"), lambda n: n == 1)  # on the model
            clients = queue_ten_clients(server)  # queued in the engine
            refused = [httpx.post(f"{server.url}/predict", json={"inputs": "stocks fell"}) for _ in range(6)]
            assert [r.status_code for r in refused] == [429] * 6, [r.text for r in refused]
            for sock in clients:
                sock.close()
            assert not busy.done(), "the long batch finished before the clients left: the test proved nothing"
            assert busy.result().status_code == 200
        wait_for(lambda: metric(server, "te_http_responses", 'status="499"'), lambda n: n == 10, timeout=30)
        assert metric(server, "te_batch_next_size_sum") == 8, "texts of clients that had left were computed"
        assert httpx.post(f"{server.url}/predict", json={"inputs": "stocks fell"}).status_code == 200
    finally:
        server.stop()


def test_a_reload_reaches_every_front_end_at_once(checkpoint_copy):
    """A reload reaches every front-end; no answer mixes models."""
    args = ("--workers", "2", "--backend", "torch", "--dtype", "float32", "--reload_interval_s", "0.1")
    server = Server(checkpoint_copy, *args).wait_ready()
    front_ends_of(server, 2)
    body = {"inputs": [[text] for text in TEXTS]}

    def tops() -> list[str]:
        with httpx.Client(base_url=server.url, timeout=60) as client:  # a new connection: any front-end
            return [row[0]["label"] for row in client.post("/predict", json=body).json()]

    try:
        old = tops()
        new = ["Sci/Tech"] * len(TEXTS)
        assert old != new
        sha = httpx.get(f"{server.url}/info").json()["distilbert_agnews"]["checkpoint"]["sha256"]
        state = torch.load(checkpoint_copy / files.WEIGHTS, weights_only=True)
        state["classifier.bias"] = torch.tensor([0.0, 0.0, 0.0, 50.0])  # now everything is Sci/Tech
        swapped_at = len(server.output())
        save_new_weights(checkpoint_copy, state)
        seen, deadline = [], time.time() + 60
        while seen.count(new) < 20 and time.time() < deadline:
            seen.append(tops())
        assert all(answer in (old, new) for answer in seen), seen  # never a mix of two models in one answer
        first = seen.index(new)
        assert seen[first:] == [new] * len(seen[first:]), seen  # never the old model after the new one
        after = re.findall(r"pid (\d+) \[\w+\] [\d.:]+ - \"POST /predict", server.output()[swapped_at:])
        assert len(set(after)) == 2, "one front-end answered every request: the test proved nothing"
        time.sleep(2 * HEARTBEAT_S)
        for _ in range(10):
            info = httpx.get(f"{server.url}/info").json()["distilbert_agnews"]["checkpoint"]
            assert info["sha256"] != sha and info["reloads"] == 1
    finally:
        server.stop()


def test_a_killed_front_end_is_replaced_and_its_gauges_dropped(served):
    server, metrics_port = served
    front_ends = front_ends_of(server)

    def pids() -> set[str]:
        scrape = samples(httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text)
        return {dict(labels)["pid"] for name, labels in scrape if name == "te_process_resident_memory_bytes"}

    for _ in range(20):  # scrapes on the API port record the memory of the front-end that answers them
        httpx.get(f"{server.url}/metrics")
    killed = next(pid for pid in front_ends if str(pid) in pids())
    os.kill(killed, signal.SIGKILL)  # the OOM killer's way: it never drops its own live gauges
    assert str(killed) not in wait_for(pids, lambda found: str(killed) not in found, timeout=30)
    wait_for(lambda: server.output().count("Front-end ready"), lambda n: n > len(front_ends), timeout=60)
    assert httpx.post(f"{server.url}/predict", json={"inputs": "stocks fell"}).status_code == 200


def test_the_engine_killed_ends_every_front_end_and_the_service(smoke_checkpoint):
    """SIGKILL to the engine's process: the front-ends see their parent gone and exit (never answering from
    nothing), within the 60 s a cluster waits; the service's exit status is non-zero."""
    server = Server(smoke_checkpoint, "--workers", "2", "--backend", "torch", "--reload_interval_s", "0").wait_ready()
    wait_for(lambda: server.output().count("Front-end ready"), lambda n: n >= 2, timeout=60)
    front_ends = [int(pid) for pid in re.findall(r"pid (\d+) \[-\] Front-end ready", server.output())]
    os.kill(server.process.pid, signal.SIGKILL)
    started = time.time()
    wait_for(lambda: [pid for pid in front_ends if Path(f"/proc/{pid}").exists()], lambda alive: not alive, 60)
    print(f"front-ends gone {time.time() - started:.1f} s after the engine")
    assert server.process.wait(10) != 0
    assert "The engine's process has ended; this front-end exits" in server.output()


def test_sigterm_drains_the_front_ends_then_the_engine_and_exits_0(smoke_checkpoint):
    server = Server(smoke_checkpoint, "--workers", "2", "--backend", "torch", "--reload_interval_s", "0").wait_ready()
    wait_for(lambda: server.output().count("Front-end ready"), lambda n: n >= 2, timeout=60)
    with ThreadPoolExecutor(8) as pool:
        body = {"inputs": [[t] for t in texts(32)]}
        answers = [pool.submit(httpx.post, f"{server.url}/predict", json=body, timeout=60) for _ in range(8)]
        # every request accepted and queued first: one still in the listen backlog would be reset, as uvicorn
        # closes its socket on SIGTERM (the drain is for requests in flight)
        wait_for(lambda: metric(server, "te_predict_count"), lambda n: n >= 8 * 32, timeout=60)
        server.process.terminate()
        assert all(a.result().status_code == 200 for a in answers)
    assert server.exit_code(60) == 0, server.output()
    assert "Task was destroyed" not in server.output()


def hold_unread_tokenize(client: httpx.Client, url: str, inputs: int):
    """A /tokenize of `inputs` long texts whose answer (tens of MB) its client never reads: it holds `inputs` of the
    shared limit while it stays unread."""
    body = json.dumps({"inputs": ["stocks fell " * 10_000] * inputs}).encode()
    return client.stream("POST", f"{url}/tokenize", content=body, headers={"content-type": "application/json"})


def test_a_killed_front_end_gives_back_what_its_clients_held(smoke_checkpoint):
    """An unread answer holds 3 of 8 inputs; its front-end SIGKILLed (an OOM kill), the engine takes them back in
    seconds (at 53a86bc: 429 for good, /ready 200)."""
    limits = ("--max_concurrent_requests", "8", "--max_client_batch_size", "8", "--write_timeout_s", "600")
    server = Server(smoke_checkpoint, "--workers", "2", "--backend", "torch", "--reload_interval_s", "0", *limits)
    server.wait_ready()
    front_ends = front_ends_of(server, 2)
    six = {"input": texts(6)}
    try:
        with ExitStack() as held:
            client = held.enter_context(httpx.Client(timeout=60))
            assert held.enter_context(hold_unread_tokenize(client, server.url, 3)).status_code == 200
            refused = httpx.post(f"{server.url}/v1/classify", json=six)
            assert refused.status_code == 429 and "3 inputs are in flight" in refused.json()["error"], refused.text
            for pid in front_ends:
                os.kill(pid, signal.SIGKILL)
            wait_for(lambda: server.output().count("Front-end ready"), lambda n: n >= 4, timeout=60)
            answered = wait_for(
                lambda: httpx.post(f"{server.url}/v1/classify", json=six), lambda r: r.status_code == 200
            )
            assert len(answered.json()["data"]) == 6
        assert "is gone: 3 admitted inputs given back" in server.output()
        assert httpx.get(f"{server.url}/ready").status_code == 200
    finally:
        server.stop()


def test_admissions_a_restarted_engine_never_granted_are_not_given_back_twice(smoke_checkpoint, tmp_path):
    """A leave of 6 inputs the previous engine admitted frees nothing in its successor: 8 admitted, a 9th refused
    (at 53a86bc the count went to -6 and 14 were admitted)."""
    settings = Settings(model_id=str(smoke_checkpoint), max_concurrent_requests=8, max_client_batch_size=8)
    address = f"ipc://{tmp_path}/engine"

    def engine_server() -> LinkServer:
        loaded = load_model(str(smoke_checkpoint), device="cpu", dtype="fp32")
        service = Service(settings, Engine(loaded, Limits(max_concurrent_requests=8), Metrics()))
        return LinkServer(service, address).start()

    async def scenario() -> None:
        first = engine_server()
        link = RemoteLink(address)
        await link.start()
        await link.admit(6)
        first.stop()
        second = engine_server()
        try:
            link.leave(6)  # what a request of the old engine's days gives back when it ends
            await asyncio.sleep(0.5)
            await link.admit(8)
            with pytest.raises(Overloaded, match="8 inputs are in flight"):
                await link.admit(1)
            link.leave(8)
            await asyncio.sleep(0.5)
            await link.admit(8)  # its own admissions come back whole
        finally:
            await link.stop()
            second.stop()

    asyncio.run(scenario())
