"""The service in-process with FastAPI's TestClient: schema, answers, every error, auth, reload, refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch
from fastapi.testclient import TestClient

from inference.app import create_app
from inference.loading import CheckpointError, load_checkpoint
from inference.settings import Settings
from tests.conftest import ROOT

TEXTS = ["Shares of oracle rose in early trading after the earnings report.",
         "The yankees beat the red sox in overtime, the ap reported.",
         "Nasa launched the spacecraft in orbit.",
         "The prime minister signed a ceasefire in gaza. Diplomats called for humanitarian aid near the border."]


def make_client(checkpoint, **settings) -> TestClient:
    settings.setdefault("precision", "fp32")
    settings.setdefault("reload_interval_s", 0)
    return TestClient(create_app(Settings(checkpoint_dir=str(checkpoint), **settings)))


@pytest.fixture
def client(smoke_checkpoint):
    with make_client(smoke_checkpoint) as c:
        yield c


def test_single_text_gets_every_label_sorted_and_equal_to_the_trained_model(client, reference):
    response = client.post("/predict", json={"inputs": TEXTS[0]})
    assert response.status_code == 200
    answer = response.json()
    assert [p["label"] for p in answer] == sorted(reference.labels, key=lambda l: -reference.scores([TEXTS[0]])[0][l])
    scores = [p["score"] for p in answer]
    assert scores == sorted(scores, reverse=True) and sum(scores) == pytest.approx(1, abs=1e-5)
    expected = reference.scores([TEXTS[0]])[0]
    assert all(abs(p["score"] - expected[p["label"]]) < 1e-5 for p in answer)


def test_batch_keeps_input_order_and_matches_single_requests(client, reference):
    batch = client.post("/predict", json={"inputs": TEXTS}).json()
    tei_form = client.post("/predict", json={"inputs": [[t] for t in TEXTS]}).json()
    assert len(batch) == len(TEXTS) and tei_form == batch
    expected = reference.scores(TEXTS)
    for answer, want in zip(batch, expected):
        assert answer[0]["label"] == max(want, key=want.get)  # same argmax as the trained model
        assert all(abs(p["score"] - want[p["label"]]) < 1e-5 for p in answer)
    assert [a[0]["label"] for a in batch] == ["Business", "Sports", "Sci/Tech", "World"]


def test_top_k_and_raw_scores(client, reference):
    top = client.post("/predict", json={"inputs": TEXTS[:2], "top_k": 2}).json()
    assert [len(a) for a in top] == [2, 2]
    raw = client.post("/predict", json={"inputs": TEXTS[1], "raw_scores": True}).json()
    with torch.no_grad():
        logits = reference.model(**reference.tokenizer(TEXTS[1], return_tensors="pt")).logits[0].tolist()
    by_label = dict(zip(reference.labels, logits))
    assert all(abs(p["score"] - by_label[p["label"]]) < 1e-4 for p in raw)
    assert sum(p["score"] for p in raw) != pytest.approx(1.0, abs=1e-3)


@pytest.mark.parametrize("body, status, error_type, words", [
    ({"inputs": ""}, 400, "empty", "empty"),
    ({"inputs": ["ok", "   "]}, 400, "empty", "inputs[1]"),
    ({"inputs": 5}, 422, "validation", "inputs"),
    ({"inputs": None}, 422, "validation", "inputs"),
    ({"inputs": ["ok", 3]}, 422, "validation", "inputs"),
    ({}, 422, "validation", "inputs"),
    ({"inputs": []}, 422, "validation", "at least one"),
    ({"inputs": [["a", "b"]]}, 422, "validation", "exactly one text"),
    ({"inputs": "ok", "top_k": 0}, 422, "validation", "top_k"),
    ({"inputs": "ok", "top_k": 5}, 422, "validation", "top_k"),
    ({"inputs": "ok", "top_k": "2"}, 422, "validation", "top_k"),
    ({"inputs": "ok", "truncate": "no"}, 422, "validation", "truncate"),
    ({"inputs": ["t"] * 33}, 422, "validation", "max_client_batch_size"),
    ({"inputs": "word " * 1000, "truncate": False}, 422, "validation", "tokens"),
])
def test_bad_requests_get_a_clear_error_body(client, body, status, error_type, words):
    response = client.post("/predict", json=body)
    assert response.status_code == status, response.text
    assert response.json()["error_type"] == error_type and words in response.json()["error"]
    assert client.post("/predict", json={"inputs": "still serving"}).status_code == 200


def test_too_long_text_reports_its_token_count_and_truncation_works(client, reference):
    text = "word " * 1000
    tokens = len(reference.tokenizer(text)["input_ids"])
    error = client.post("/predict", json={"inputs": text, "truncate": False}).json()["error"]
    assert f"{tokens} tokens" in error and "maximum of 512" in error
    assert client.post("/predict", json={"inputs": text}).status_code == 200


def test_bad_json_and_oversized_bodies(client):
    assert client.post("/predict", content=b"{not json").json()["error_type"] == "validation"
    # no content-type at all (curl -d): still read as JSON
    assert client.post("/predict", content=json.dumps({"inputs": "ok"}).encode()).status_code == 200
    huge = client.post("/predict", content=b"{" + b" " * (2 * 1024 * 1024 + 10) + b"}")
    assert huge.status_code == 413 and huge.json()["error_type"] == "payload_too_large"

    def chunks():  # no Content-Length: the limit is enforced while streaming
        for _ in range(300):
            yield b" " * 10_000

    assert client.post("/predict", content=chunks()).status_code == 413


def test_queue_full_is_429(smoke_checkpoint):
    with make_client(smoke_checkpoint, max_queue_size=3) as small:
        response = small.post("/predict", json={"inputs": ["a", "b", "c", "d"]})
        assert response.status_code == 429 and response.json()["error_type"] == "overloaded"
        assert small.post("/predict", json={"inputs": ["a", "b"]}).status_code == 200


def test_not_ready_is_503_and_health_is_alive(smoke_checkpoint):
    app = create_app(Settings(checkpoint_dir=str(smoke_checkpoint), reload_interval_s=0))
    not_started = TestClient(app)  # lifespan not entered: no model loaded
    assert not_started.get("/health").json() == {"status": "ok"}
    assert not_started.get("/ready").status_code == 503
    response = not_started.post("/predict", json={"inputs": "hello"})
    assert response.status_code == 503 and response.json()["error_type"] == "unhealthy"


def test_info_metrics_and_docs(client, smoke_checkpoint):
    client.post("/predict", json={"inputs": TEXTS})
    client.post("/predict", json={"inputs": ""})
    info = client.get("/info").json()
    assert info["labels"] == ["World", "Sports", "Business", "Sci/Tech"] and info["model_type"] == "distilbert"
    assert info["max_input_length"] == 512 and info["max_client_batch_size"] == 32 and info["precision"] == "fp32"
    metrics_json = json.loads((smoke_checkpoint / "metrics.json").read_text())
    assert info["checkpoint"]["metrics"]["test"] == metrics_json["test"]
    import hashlib

    assert info["checkpoint"]["sha256"] == hashlib.sha256((smoke_checkpoint / "distilbert_agnews.pt").read_bytes()).hexdigest()
    text = client.get("/metrics").text
    assert 'predict_requests_total{status="200"} 1' in text and 'predict_requests_total{status="400"} 1' in text
    assert "predict_request_duration_seconds_count 2" in text and "inference_batch_size_sum 4" in text
    assert "inference_queue_depth 0" in text
    assert client.get("/docs").status_code == 200 and "/predict" in client.get("/openapi.json").json()["paths"]


def test_an_inference_failure_is_a_500_with_the_error_body_and_is_counted_as_500(smoke_checkpoint, monkeypatch):
    import inference.engine

    def broken(loaded, input_ids):
        raise RuntimeError("forward failed")

    app = create_app(Settings(checkpoint_dir=str(smoke_checkpoint), precision="fp32", reload_interval_s=0))
    with TestClient(app, raise_server_exceptions=False) as c:
        monkeypatch.setattr(inference.engine, "forward", broken)  # after the warm-up
        response = c.post("/predict", json={"inputs": "hello"})
        assert response.status_code == 500
        assert response.json() == {"error": "internal error (RuntimeError)", "error_type": "internal"}
        monkeypatch.undo()
        assert c.post("/predict", json={"inputs": "the worker survived"}).status_code == 200
        text = c.get("/metrics").text
        assert 'predict_requests_total{status="500"} 1' in text and 'predict_requests_total{status="200"} 1' in text


def test_api_key_protects_predict_and_info_only(smoke_checkpoint):
    with make_client(smoke_checkpoint, api_key="s3cret") as c:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            response = c.post("/predict", json={"inputs": "x"}, headers=headers)
            assert response.status_code == 401 and response.json()["error_type"] == "unauthorized"
            assert c.get("/info", headers=headers).status_code == 401
        good = {"Authorization": "Bearer s3cret"}
        assert c.post("/predict", json={"inputs": "x"}, headers=good).status_code == 200
        assert c.get("/info", headers=good).status_code == 200
        assert all(c.get(path).status_code == 200 for path in ("/health", "/ready", "/metrics"))


def test_reload_swaps_in_a_new_checkpoint_and_refuses_a_broken_one(checkpoint_copy):
    with make_client(checkpoint_copy, reload_interval_s=0.1) as c:
        before = c.get("/info").json()["checkpoint"]
        weights = checkpoint_copy / "distilbert_agnews.pt"
        state = torch.load(weights, weights_only=True)
        state["classifier.bias"] = torch.tensor([0.0, 0.0, 0.0, 50.0])  # now everything is Sci/Tech
        tmp = weights.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, weights)  # what training does
        after = wait_for(lambda: c.get("/info").json()["checkpoint"], lambda info: info["sha256"] != before["sha256"])
        assert after["reloads"] == 1
        assert c.post("/predict", json={"inputs": TEXTS[1]}).json()[0]["label"] == "Sci/Tech"

        weights.write_bytes(weights.read_bytes()[:1000])  # truncated: must be refused
        wait_for(lambda: c.get("/metrics").text, lambda text: 'model_reloads_total{result="failed"} 1' in text)
        assert c.get("/info").json()["checkpoint"]["sha256"] == after["sha256"]
        assert c.post("/predict", json={"inputs": TEXTS[1]}).json()[0]["label"] == "Sci/Tech"


def wait_for(get, ok, timeout: float = 15):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = get()
        if ok(value):
            return value
        time.sleep(0.1)
    raise AssertionError(f"condition not met in {timeout}s; last value: {value}")


class Exploit:
    """Unpickling this would run code: create a marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_checkpoints_that_are_not_plain_tensors_are_refused(checkpoint_copy, tmp_path):
    weights = checkpoint_copy / "distilbert_agnews.pt"
    marker = tmp_path / "code_ran"
    torch.save({"classifier.bias": Exploit(str(marker))}, weights)
    with pytest.raises(CheckpointError, match="distilbert_agnews.pt"):
        load_checkpoint(checkpoint_copy, torch.device("cpu"), None)
    assert not marker.exists()
    weights.write_bytes(b"")
    with pytest.raises(CheckpointError, match="distilbert_agnews.pt"):
        load_checkpoint(checkpoint_copy, torch.device("cpu"), None)
    weights.unlink()
    with pytest.raises(CheckpointError, match="distilbert_agnews.pt: missing"):
        load_checkpoint(checkpoint_copy, torch.device("cpu"), None)


def test_command_refuses_to_start_with_one_line_naming_the_file(checkpoint_copy, tmp_path):
    weights = checkpoint_copy / "distilbert_agnews.pt"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # truncated
    result = subprocess.run([sys.executable, "-m", "inference", "--checkpoint_dir", str(checkpoint_copy)],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(weights) in lines[0] and lines[0].startswith("inference: error:")


def test_safetensors_checkpoint_is_served(checkpoint_copy, reference):
    from safetensors.torch import save_file

    weights = checkpoint_copy / "distilbert_agnews.pt"
    save_file(torch.load(weights, weights_only=True), checkpoint_copy / "distilbert_agnews.safetensors")
    weights.unlink()
    with make_client(checkpoint_copy) as c:
        answer = c.post("/predict", json={"inputs": TEXTS[2]}).json()
    want = reference.scores([TEXTS[2]])[0]
    assert all(abs(p["score"] - want[p["label"]]) < 1e-5 for p in answer)


def test_serving_imports_nothing_from_training():
    code = "import sys, inference.app, inference.__main__; print([m for m in sys.modules if m.startswith('training')])"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr
