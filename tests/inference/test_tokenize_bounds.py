"""What /tokenize may cost, over real HTTP."""

from __future__ import annotations

import json
import re
import threading
import time
from contextlib import ExitStack

import httpx
import pytest

from inference.front_end.token_routes import TOKENIZE_PAYLOADS
from tests.helpers.processes import cli_env
from tests.helpers.service import Server, wait_for
from tests.helpers.tokenizer_kinds import hf_folder

MAX_LENGTH = 512  # the folder's tokenizer and positions
CHARS = MAX_LENGTH * 250  # TEI's per-input bound: max_length x MAX_CHAR_MULTIPLIER
# the documented bound with the default settings (docs/serving.md, "Memory"): two texts encoding at ~100 MB each,
# and 21 bytes a token for every token of the text being answered (at most one a byte)
BOUND_MB = 2 * 100 + TOKENIZE_PAYLOADS * 2_000_000 * 21 // 2**20


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return hf_folder("byte-level-bpe", tmp_path_factory.mktemp("byte-level") / "model")


def post(url: str, body: dict) -> httpx.Response:
    data = json.dumps(body, ensure_ascii=False).encode()  # as clients send UTF-8: 4 bytes an emoji
    return httpx.post(f"{url}/tokenize", content=data, headers={"content-type": "application/json"}, timeout=300)


def megabytes(server: Server, field: str) -> int:
    status = open(f"/proc/{server.process.pid}/status").read()
    return int(re.search(rf"{field}:\s+(\d+)", status).group(1)) // 1024


def test_five_maximal_requests_at_once_are_answered_in_bounded_memory(folder):
    """Maximal emoji requests, five at once, within the memory bound."""
    server = Server(folder, "--backend", "torch", env=cli_env()).wait_ready()
    try:
        body = {"inputs": ["🔋" * (CHARS - 1)] * 3}
        assert post(server.url, {"inputs": "warm up"}).status_code == 200
        before = megabytes(server, "VmHWM")
        answers: list[httpx.Response] = []
        threads = [threading.Thread(target=lambda: answers.append(post(server.url, body))) for _ in range(5)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        assert [a.status_code for a in answers] == [200] * 5
        assert answers[0].headers.get("transfer-encoding") == "chunked"  # streamed, never built whole
        rows = answers[0].json()
        assert len(rows) == 3 and len(rows[0]) == 2 * (CHARS - 1) + 2  # two tokens an emoji, and <s> </s>
        assert rows[0][1] == {"id": rows[0][1]["id"], "text": "🔋", "special": False, "start": 0, "stop": 4}
        assert rows[0][2]["start"] == 0 and rows[0][-2]["stop"] == 4 * (CHARS - 1)
        peak = megabytes(server, "VmHWM") - before
        print(f"five maximal /tokenize requests at once: peak +{peak} MB (bound {BOUND_MB} MB)")
        assert peak < BOUND_MB
        kept = wait_for(lambda: megabytes(server, "VmRSS") - before, lambda mb: mb < 100, timeout=30)
        print(f"kept after: +{kept} MB")
    finally:
        server.stop()


def test_the_text_and_inputs_being_answered_are_bounded_and_given_back_when_clients_leave(folder):
    """Unread answers count against the limits until their clients close."""
    limits = {"PAYLOAD_LIMIT": "400000", "MAX_CONCURRENT_REQUESTS": "30", "MAX_CLIENT_BATCH_SIZE": "30"}
    server = Server(folder, "--backend", "torch", env=cli_env(**limits)).wait_ready()
    texts = ["stocks fell " * 10_000] * 3  # 360 KB: a ~40 MB answer no socket buffer holds
    data = json.dumps({"inputs": texts}).encode()
    try:
        with ExitStack() as held:
            client = held.enter_context(httpx.Client(timeout=60))
            for _ in range(TOKENIZE_PAYLOADS):  # answered, headers sent, not read
                response = held.enter_context(
                    client.stream(
                        "POST", f"{server.url}/tokenize", content=data, headers={"content-type": "application/json"}
                    )
                )
                assert response.status_code == 200
            refused = httpx.post(f"{server.url}/tokenize", content=data, headers={"content-type": "application/json"})
            assert refused.status_code == 429 and refused.json()["error_type"] == "Overloaded"
            assert (
                f"limit {TOKENIZE_PAYLOADS} x PAYLOAD_LIMIT = {TOKENIZE_PAYLOADS * 400_000}" in refused.json()["error"]
            )
            busy = httpx.post(f"{server.url}/predict", json={"inputs": [["a"]] * 7})  # 8 x 3 held + 7 > 30
            assert busy.status_code == 429 and "max_concurrent_requests = 30" in busy.json()["error"]
            assert httpx.post(f"{server.url}/predict", json={"inputs": [["a"]] * 6}).status_code == 200
        # the clients closed: what they held comes back
        wait_for(lambda: post(server.url, {"inputs": texts}).status_code, lambda code: code == 200, timeout=30)
        assert httpx.post(f"{server.url}/predict", json={"inputs": [["a"]] * 30}).status_code == 200
    finally:
        server.stop()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_an_answer_nobody_reads_ends_after_the_write_timeout(folder, workers):
    """An answer nobody reads holds 3 of 8 inputs until WRITE_TIMEOUT_S closes its connection (at 53a86bc: for as
    long as its client stayed connected)."""
    limits = {"MAX_CONCURRENT_REQUESTS": "8", "MAX_CLIENT_BATCH_SIZE": "8", "WRITE_TIMEOUT_S": "2", "WORKERS": workers}
    server = Server(folder, "--backend", "torch", env=cli_env(**limits)).wait_ready()
    data = json.dumps({"inputs": ["stocks fell " * 10_000] * 3}).encode()
    six = {"inputs": [["stocks fell"]] * 6}
    try:
        with (
            httpx.Client(timeout=60) as client,
            client.stream(
                "POST", f"{server.url}/tokenize", content=data, headers={"content-type": "application/json"}
            ) as unread,
        ):
            assert unread.status_code == 200
            busy = httpx.post(f"{server.url}/predict", json=six)
            assert busy.status_code == 429 and "3 inputs are in flight" in busy.json()["error"], busy.text
            started = time.monotonic()
            wait_for(lambda: httpx.post(f"{server.url}/predict", json=six).status_code, lambda code: code == 200)
            print(f"given back {time.monotonic() - started:.1f} s after the refusal")
            with pytest.raises(httpx.HTTPError):  # the connection was closed under it: the answer is cut short
                b"".join(unread.iter_bytes())
        assert "read none of its answer for 2s" in server.output()
    finally:
        server.stop()
