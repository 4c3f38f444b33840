"""LONG_TEXT=chunk: every window scored and pooled, over real HTTP."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pandas as pd
import pytest
import torch
from huggingface_hub import InferenceClient

from contract import files
from contract.loading import load_model
from tests.helpers.service import Server, run_cli
from tests.inference.test_app import make_client

pytestmark = pytest.mark.slow
LABELS = ["World", "Sports", "Business", "Sci/Tech"]


@pytest.fixture(scope="module")
def stories(smoke_dir) -> list[str]:
    return list(pd.read_csv(smoke_dir / "long_test.csv")["text"][:12])


@torch.no_grad()
def expected(model, texts: list[str], chunk: bool = True) -> list[dict[str, float]]:
    """Each text alone through the plain model: its windows' logits averaged (chunk) or its one truncated input."""
    loaded = load_model(str(model), device="cpu", dtype="fp32")
    answers = []
    for text in texts:
        if chunk:
            windows = loaded.long_text.encode(loaded.tokenizer, [text], None, loaded.long_text.window)
            ids = [torch.tensor([f["input_ids"]]) for f in windows.features]
        else:
            ids = [loaded.tokenizer(text, truncation=True, max_length=loaded.max_length, return_tensors="pt").input_ids]
        logits = torch.cat([loaded.model(input_ids=i).logits for i in ids]).mean(0)
        answers.append(dict(zip(LABELS, logits.softmax(-1).tolist())))
    return answers


def scores(answer: list[dict]) -> dict[str, float]:
    return {p["label"]: p["score"] for p in answer}


def window_tokens(model, text: str) -> int:
    loaded = load_model(str(model), device="cpu", dtype="fp32")
    windows = loaded.long_text.encode(loaded.tokenizer, [text], None, loaded.long_text.window)
    return sum(len(f["input_ids"]) for f in windows.features)


def test_windows_are_pooled_and_truncate_true_is_still_teis(smoke_long_model, stories):
    with make_client(smoke_long_model, dtype="float32", backend="torch") as client:
        answer = client.post("/predict", json={"inputs": [[story] for story in stories]})
        assert answer.status_code == 200, answer.text
        for got, want in zip(answer.json(), expected(smoke_long_model, stories)):
            assert scores(got) == pytest.approx(want, abs=1e-5)
        one = client.post("/predict", json={"inputs": stories[0]})
        assert int(one.headers["x-compute-tokens"]) == window_tokens(smoke_long_model, stories[0])
        cut = client.post("/predict", json={"inputs": stories[0], "truncate": True})
        assert scores(cut.json()) == pytest.approx(expected(smoke_long_model, stories[:1], chunk=False)[0], abs=1e-5)
        assert int(cut.headers["x-compute-tokens"]) < int(one.headers["x-compute-tokens"])
        served = client.get("/info").json()["distilbert_agnews"]["long_text"]
        assert served == {
            "long_text": "chunk",
            "chunk_stride": 8,
            "chunk_pooling": "mean",
            "chunk_max_length": 48,
            "max_chunks": 16,
        }
    with make_client(smoke_long_model, dtype="float32", backend="torch", long_text="truncate") as client:
        plain = client.post("/predict", json={"inputs": stories[0]})
        assert scores(plain.json()) == pytest.approx(scores(cut.json()), abs=1e-6)


def test_more_windows_than_max_chunks_is_413(smoke_long_model, stories):
    with make_client(smoke_long_model, dtype="float32", backend="torch", max_chunks=3) as client:
        refused = client.post("/predict", json={"inputs": ["a short story about the election", stories[0]]})
        assert refused.status_code == 413
        body = refused.json()
        assert body["error_type"] == "Validation" and "at most 3 are allowed (MAX_CHUNKS)" in body["error"]
        assert client.post("/predict", json={"inputs": stories[0], "truncate": True}).status_code == 200
        huge = client.post("/predict", json={"inputs": "word " * 40_000})  # refused before it is tokenized
        assert huge.status_code == 413 and "MAX_CHUNKS" in huge.json()["error"]


def test_64_concurrent_clients_mixing_long_and_short_texts_get_their_own_answers(smoke_long_model, stories):
    short = ["The president signed the peace treaty.", "The striker scored twice in the final."]
    texts = [stories[i % len(stories)] if i % 2 else short[i % 4 // 2] for i in range(64)]
    server = Server(smoke_long_model, "--backend", "torch", "--dtype", "float32", "--reload_interval_s", "0")
    server.wait_ready()
    try:
        alone = {text: scores(httpx.post(f"{server.url}/predict", json={"inputs": text}).json()) for text in set(texts)}

        async def ask_all() -> list[dict]:
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
                answers = await asyncio.gather(*(client.post("/predict", json={"inputs": t}) for t in texts))
            return [scores(a.json()) for a in answers]

        together = asyncio.run(ask_all())
        for text, got in zip(texts, together):
            assert got == pytest.approx(alone[text], abs=1e-5)
        best = InferenceClient(base_url=server.url).text_classification(stories[0])
        want = expected(smoke_long_model, stories[:1])[0]
        assert best.label == max(want, key=want.get) and best.score == pytest.approx(max(want.values()), abs=1e-5)
    finally:
        server.stop()


def test_a_model_that_cannot_be_windowed_is_refused_at_start(smoke_long_model, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(smoke_long_model, folder, ignore=shutil.ignore_patterns(files.STATE_DIR, files.RUNTIME_DIR))
    config = json.loads((folder / files.CONFIG).read_text())
    config["chunk_stride"] = 64  # not below the 46 text tokens of a 48-token window
    (folder / files.CONFIG).write_text(json.dumps(config))
    result = run_cli("--model_id", str(folder), "--backend", "torch", "--reload_interval_s", "0")
    assert result.returncode == 2, result.stderr
    assert "LONG_TEXT=chunk cannot serve" in result.stderr and "chunk_stride: must be smaller" in result.stderr
    assert "Traceback" not in result.stderr


def news_words(n: int, seed: int) -> str:
    words = "officials said on monday that the markets rallied after reuters reported unbelievable earnings".split()
    return " ".join(words[(i * 7 + seed) % len(words)] + ("," if i % 13 == 0 else "") for i in range(n))


@pytest.mark.slow
def test_a_megabyte_request_costs_the_model_thread_what_its_truncated_length_needs(smoke_long_model):
    """Over-long pairs and documents are cut before tokenizing."""
    pair = {"inputs": [news_words(100_000, 1), news_words(100_000, 2)], "truncate": True}  # ~1.2 MB
    documents = {"inputs": [[news_words(30_000, k)] for k in range(10)]}  # ~1.9 MB, each past MAX_CHUNKS windows
    short = {"inputs": "a short story about the election"}
    with make_client(smoke_long_model, dtype="float32", backend="torch", max_client_batch_size=10) as client:
        client.post("/predict", json=short)  # warm
        for body, status in ((pair, 200), (documents, 413)):
            with ThreadPoolExecutor(2) as pool:
                started = time.perf_counter()
                big = pool.submit(client.post, "/predict", json=body)
                time.sleep(0.05)  # the big request is being worked on
                small = pool.submit(lambda: (client.post("/predict", json=short), time.perf_counter()))
                answer, (quick, answered_at) = big.result(), small.result()
            assert answer.status_code == status and quick.status_code == 200, answer.text[:300]
            assert answered_at - started < 1.5, f"a short request waited {answered_at - started:.2f} s"
        tokenizing_ms = int(client.post("/predict", json=pair).headers["x-tokenization-time"])
        assert tokenizing_ms < 500, f"{tokenizing_ms} ms tokenizing a 1 MB pair (4,500 ms before)"
