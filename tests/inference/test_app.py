"""The service in-process with FastAPI's TestClient: answers, errors, limits, auth, operations, reload, refusals."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from fastapi.testclient import TestClient

from contract import files, shapes
from contract.loading import CheckpointError, load_model
from inference.app import create_app
from inference.engine.captured import CapturedForward
from inference.engine.passes import static_passes
from inference.settings import Settings, SettingsError, from_env
from tests.helpers.cuda_graphs.stand_in import install_serving
from tests.helpers.files import save_new_weights
from tests.helpers.processes import ROOT
from tests.helpers.service import ag_news_texts, assert_matches, run_cli, wait_for

TEXTS = [
    "Shares of oracle rose in early trading after the earnings report.",
    "The yankees beat the red sox in overtime, the ap reported.",
    "Nasa launched the spacecraft in orbit.",
    "The prime minister signed a ceasefire in gaza. Diplomats called for humanitarian aid near the border.",
]

JSON = {"content-type": "application/json"}


def make_client(checkpoint, **settings) -> TestClient:
    settings.setdefault("dtype", "fp32")
    settings.setdefault("reload_interval_s", 0)
    settings.setdefault("measure_in_background", False)  # as Server: tests/inference/test_first_answer.py tests it
    return TestClient(create_app(Settings(model_id=str(checkpoint), **settings)))


@pytest.fixture(scope="module")
def client(smoke_checkpoint):
    with make_client(smoke_checkpoint) as c:
        yield c


def test_single_text_gets_every_label_sorted_and_equal_to_the_trained_model(client, reference):
    response = client.post("/predict", json={"inputs": TEXTS[0]})
    assert response.status_code == 200
    assert_matches(response.json(), reference.probabilities(TEXTS[0]))
    assert sum(p["score"] for p in response.json()) == pytest.approx(1, abs=1e-5)


def test_batch_keeps_input_order_and_matches_single_requests(client, reference):
    batch = client.post("/predict", json={"inputs": [[t] for t in TEXTS]}).json()
    assert len(batch) == len(TEXTS)
    for answer, text in zip(batch, TEXTS):
        assert_matches(answer, reference.probabilities(text))
        alone = client.post("/predict", json={"inputs": text}).json()  # padded differently: equal to float noise
        assert [p["label"] for p in answer] == [p["label"] for p in alone]
    # each answer is its own text's (checked above); different labels make a reordering visible
    assert len({a[0]["label"] for a in batch}) >= 3, batch


@pytest.mark.parametrize(
    "body, status, error_type, words",
    [
        ({"inputs": ""}, 400, "Empty", "cannot be empty"),
        ({"inputs": [["ok"], [""]]}, 400, "Empty", "inputs[1]"),
        ({"inputs": 5}, 422, "Validation", "inputs"),
        ({"inputs": None}, 422, "Validation", "inputs"),
        ({"inputs": ["ok", 3]}, 422, "Validation", "inputs"),
        ({}, 422, "Validation", "inputs"),
        ({"inputs": []}, 422, "Validation", "inputs"),
        ({"inputs": ["a", "b", "c"]}, 422, "Validation", "send a batch as"),
        ({"inputs": "ok", "top_k": 0}, 422, "Validation", "top_k"),
        ({"inputs": "ok", "top_k": "2"}, 422, "Validation", "top_k"),
        ({"inputs": "ok", "truncate": "no"}, 422, "Validation", "truncate"),
        ({"inputs": "ok", "raw_scores": None}, 422, "Validation", "raw_scores"),
        ({"inputs": [["t"]] * 33}, 422, "Validation", "maximum allowed batch size 32"),
        ({"inputs": "word " * 1000, "truncate": False}, 422, "Validation", "tokens"),
    ],
)
def test_bad_requests_get_a_clear_error_body(client, body, status, error_type, words):
    response = client.post("/predict", json=body)
    assert response.status_code == status, response.text
    assert response.json()["error_type"] == error_type and words in response.json()["error"]
    assert client.post("/predict", json={"inputs": "still serving"}).status_code == 200


def test_bad_json_and_oversized_bodies(client):
    bad = client.post("/predict", content=b"{not json", headers=JSON)
    assert bad.status_code == 400 and bad.json()["error_type"] == "Validation" and "not valid JSON" in bad.text
    # no content-type at all (curl -d without -H): TEI's 415 (axum's Json extractor)
    assert client.post("/predict", content=json.dumps({"inputs": "ok"}).encode()).status_code == 415
    huge = client.post("/predict", content=b"{" + b" " * 2_000_010 + b"}", headers=JSON)
    assert huge.status_code == 413 and huge.json()["error_type"] == "Validation"
    assert "PAYLOAD_LIMIT" in huge.json()["error"]

    def chunks():  # no Content-Length: the limit is enforced while streaming
        for _ in range(300):
            yield b" " * 10_000

    assert client.post("/predict", content=chunks(), headers=JSON).status_code == 413


@contextlib.contextmanager
def model_busy(client: TestClient, inputs: list, headers: dict | None = None):
    """`inputs` in flight: posted on a thread, their forward pass held until the block ends; yields their response
    holder (filled once released)."""
    import inference.engine.scheduler

    entered, release, original, answer = threading.Event(), threading.Event(), inference.engine.scheduler.forward, []

    def held(*args):
        entered.set()
        release.wait(30)
        return original(*args)

    inference.engine.scheduler.forward = held
    poster = threading.Thread(target=lambda: answer.append(client.post("/predict", json=inputs, headers=headers)))
    poster.start()
    try:
        assert entered.wait(30), "the first request never reached the model"
        yield answer
    finally:
        release.set()
        poster.join(30)
        inference.engine.scheduler.forward = original


def test_more_inputs_in_flight_than_max_concurrent_requests_is_429(smoke_checkpoint):
    with make_client(smoke_checkpoint, max_concurrent_requests=3, max_client_batch_size=3) as small:
        with model_busy(small, {"inputs": [["a"], ["b"]]}) as first:
            response = small.post("/predict", json={"inputs": [["c"], ["d"]]})
            assert response.status_code == 429 and response.json()["error_type"] == "Overloaded"
            assert "2 inputs are in flight" in response.json()["error"]
        assert first[0].status_code == 200 and len(first[0].json()) == 2
        assert small.post("/predict", json={"inputs": [["a"], ["b"], ["c"]]}).status_code == 200


def test_a_client_batch_larger_than_the_concurrency_limit_is_refused_at_start(smoke_checkpoint):
    """A batch between the two limits could never be admitted: every retry would get 429 with nothing in flight."""
    with pytest.raises(SettingsError, match=r"MAX_CLIENT_BATCH_SIZE: 64 is above MAX_CONCURRENT_REQUESTS \(8\)"):
        from_env(model_id=str(smoke_checkpoint), max_concurrent_requests=8, max_client_batch_size=64)
    result = run_cli("--model_id", str(smoke_checkpoint), "--max_concurrent_requests", "8")
    assert result.returncode == 2 and result.stdout == "", result
    assert result.stderr.splitlines() == [
        "inference: error: MAX_CLIENT_BATCH_SIZE: 32 is above MAX_CONCURRENT_REQUESTS (8): a batch that large "
        "would always be answered 429; lower it or raise MAX_CONCURRENT_REQUESTS"
    ]


def test_micro_batches_are_bounded_by_tokens_and_inputs(smoke_checkpoint, reference):
    """MAX_BATCH_TOKENS bounds every forward pass (padded tokens), MAX_BATCH_REQUESTS its inputs."""
    import inference.engine.scheduler

    sizes: list[tuple[int, int]] = []
    original = inference.engine.scheduler.forward

    def recording(loaded, features, *shape):
        logits = original(loaded, features, *shape)
        sizes.append((len(features), max(len(f["input_ids"]) for f in features)))
        return logits

    texts = [" ".join(["the yankees beat the red sox"] * (20 + 3 * i)) for i in range(12)]  # 122..~490 tokens
    with make_client(smoke_checkpoint, max_batch_tokens=1024, max_batch_requests=4) as c:
        inference.engine.scheduler.forward = recording
        try:
            answer = c.post("/predict", json={"inputs": [[t] for t in texts]}).json()
        finally:
            inference.engine.scheduler.forward = original
    assert sizes and all(n <= 4 and n * (-(-longest // 8) * 8) <= 1024 for n, longest in sizes), sizes
    assert sum(n for n, _ in sizes) == len(texts)
    for got, text in zip(answer, texts):
        assert_matches(got, reference.probabilities(text), tolerance=1e-4)


@pytest.fixture(scope="module")
def static_client(smoke_checkpoint):
    """The service as on CUDA (the torch runtime, STATIC_SHAPES and TOKENIZER_THREAD on, every forward pass a
    replayed CUDA graph: inference/engine/captured.py's CapturedForward over the CPU stand-in of
    tests/helpers/cuda_graphs) on the CPU, recording every forward pass's shape."""
    with pytest.MonkeyPatch.context() as patch:
        install_serving(patch)
        with make_client(smoke_checkpoint, static_shapes=True, tokenizer_thread=True, backend="torch") as c:
            assert isinstance(c.app.state.service.engine.current.runner, CapturedForward)
            yield recording_shapes(c)


def recording_shapes(c: TestClient) -> TestClient:
    """`c` with `shapes_seen`: the input shape of every forward pass of its model from now on."""
    shapes_seen = []
    c.app.state.service.engine.current.model.register_forward_pre_hook(
        lambda module, args, kwargs: shapes_seen.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    c.shapes_seen = shapes_seen
    return c


@pytest.mark.parametrize("static", [False, True], ids=["dynamic-shapes", "static-shapes"])
def test_two_thousand_real_texts_from_concurrent_clients_get_the_unbatched_models_answers(
    request, static, reference, smoke_checkpoint
):
    """Batching changes no answer: 2,000 texts from 16 clients, CPU and CUDA paths."""
    client = request.getfixturevalue("static_client" if static else "client")
    texts = ag_news_texts(2000)
    requests, start = [], 0
    while start < len(texts):
        requests.append(texts[start : start + 1 + len(requests) % 8])
        start += len(requests[-1])
    before = client.get("/metrics").text
    with ThreadPoolExecutor(16) as pool:
        responses = list(
            pool.map(lambda chunk: client.post("/predict", json={"inputs": [[t] for t in chunk]}), requests)
        )
    assert all(r.status_code == 200 for r in responses)
    answers = [answer for r in responses for answer in r.json()]
    assert len(answers) == len(texts)
    for answer, text in zip(answers, texts):
        expected = reference.probabilities(text)
        assert answer[0]["label"] == max(expected, key=expected.get), text
        assert_matches(answer, expected, tolerance=1e-4)
    merged = histogram_count(client.get("/metrics").text, "te_batch_next_size", above=8) - histogram_count(
        before, "te_batch_next_size", above=8
    )
    assert merged > 0, "no micro-batch held more inputs than one request: nothing was batched"
    if static:
        loaded = client.app.state.service.engine.current
        rows, widths = shapes.serving_buckets(32, loaded.max_length)  # MAX_BATCH_REQUESTS's default
        assert set(client.shapes_seen) <= {(r, w) for r in rows for w in widths}, client.shapes_seen
        exposition = client.get("/metrics").text
        micro_batches = next(
            float(r.split()[-1]) for r in exposition.splitlines() if r.startswith("te_batch_next_size_count")
        )
        assert len(client.shapes_seen) == micro_batches  # one forward pass each (warm-up ran before the hook)


def test_static_shapes_pad_each_pass_to_the_smallest_fixed_shape_within_the_token_budget():
    rows, widths = shapes.serving_buckets(32, 512)
    assert rows == (1, 2, 4, 8, 16, 32) and widths == (16, 32, 64, 128, 256, 512)
    assert shapes.serving_buckets(24, 100) == ((1, 2, 4, 8, 16, 24), (16, 32, 64, 100))  # the limits themselves last
    items = [(0, i, {"input_ids": [1] * n}) for i, n in enumerate([5, 20, 40, 300])]  # sorted by length
    assert [(len(p), r, w) for p, r, w in static_passes(items, rows, widths, 16384)] == [(4, 4, 512)]  # one pass
    # 4 rows x 512 would pass a 1,024-token budget: the longest input gets a pass of its own
    assert [(len(p), r, w) for p, r, w in static_passes(items, rows, widths, 1024)] == [(3, 4, 64), (1, 1, 512)]
    # never more rows than the largest bucket
    many = [(0, i, {"input_ids": [1] * 8}) for i in range(40)]
    assert [(len(p), r, w) for p, r, w in static_passes(many, rows, widths, 16384)] == [(32, 32, 16), (8, 8, 16)]


def histogram_count(exposition: str, name: str, above: float) -> float:
    """Observations of a Prometheus histogram above `above` (its +Inf count minus the bucket `le` = above)."""

    def bucket(le: str) -> float:
        line = next(row for row in exposition.splitlines() if row.startswith(f'{name}_bucket{{le="{le}"'))
        return float(line.split()[-1])

    return bucket("+Inf") - bucket(f"{float(above)}")


def test_not_ready_is_503_unhealthy(smoke_checkpoint):
    app = create_app(Settings(model_id=str(smoke_checkpoint), reload_interval_s=0))
    not_started = TestClient(app)  # lifespan not entered: no model loaded
    for path in ("/health", "/ping", "/ready", "/info"):
        response = not_started.get(path)
        assert response.status_code == 503 and response.json()["error_type"] == "Unhealthy", path
    response = not_started.post("/predict", json={"inputs": "hello"})
    assert response.status_code == 503 and response.json()["error_type"] == "Unhealthy"


def test_info_and_metrics(client, smoke_checkpoint):
    before = client.get("/metrics").text
    client.post("/predict", json={"inputs": [[t] for t in TEXTS]})
    client.post("/predict", json={"inputs": ""})
    info = client.get("/info").json()
    metrics_json = json.loads((smoke_checkpoint / files.METRICS).read_text())
    ours = info["distilbert_agnews"]
    assert ours["checkpoint"]["metrics"]["test"] == metrics_json["test"]
    assert ours["checkpoint"]["sha256"] == hashlib.sha256((smoke_checkpoint / files.WEIGHTS).read_bytes()).hexdigest()
    text = client.get("/metrics").text

    def value(line_start: str, exposition: str) -> float:
        return float(
            next((row for row in exposition.splitlines() if row.startswith(line_start + " ")), "x 0").split()[-1]
        )

    # TEI's series, counters written without prometheus-client's `_total` suffix (as TEI's exporter writes them)
    assert value('te_request_count{method="batch"}', text) == value('te_request_count{method="batch"}', before) + 1
    assert value('te_request_failure{err="empty"}', text) == value('te_request_failure{err="empty"}', before) + 1
    for name in (
        "te_request_duration_count",
        "te_request_input_length_count",
        "te_batch_next_size_count",
        "te_batch_next_tokens_count",
        "te_queue_size",
        "te_process_resident_memory_bytes",
    ):
        assert any(row.startswith(name) for row in text.splitlines()), name
    assert "_total" not in text and "_created" not in text


def test_docs_and_the_bearer_security_scheme(smoke_checkpoint):
    with make_client(smoke_checkpoint, api_key="s3cret") as c:
        schema = c.get("/openapi.json").json()
        assert c.get("/docs").status_code == 200
    assert schema["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert schema["paths"]["/predict"]["post"]["security"] == [{"HTTPBearer": []}]
    assert "security" not in schema["paths"]["/health"]["get"]


def test_an_inference_failure_is_424_backend_and_the_worker_lives_on(smoke_checkpoint, monkeypatch):
    import inference.engine.scheduler

    def broken(*args):
        raise RuntimeError("forward failed")

    with make_client(smoke_checkpoint) as c:
        monkeypatch.setattr(inference.engine.scheduler, "forward", broken)  # after the warm-up
        response = c.post("/predict", json={"inputs": "hello"})
        assert response.status_code == 424
        assert response.json() == {"error": "inference failed (RuntimeError: forward failed)", "error_type": "Backend"}
        monkeypatch.undo()
        assert c.post("/predict", json={"inputs": "the worker survived"}).status_code == 200
        assert 'te_request_failure{err="backend"} 1' in c.get("/metrics").text


@pytest.mark.parametrize("where", ["client", "static_client"], ids=["model-thread", "tokenizer-thread"])
def test_a_tokenizer_failure_is_424_and_the_engine_lives_on(request, where, monkeypatch):
    """A tokenizer that raises (in the front-end, which tokenizes) fails its request with 424."""
    import inference.front_end.encoder

    client = request.getfixturevalue(where)
    assert client.app.state.service.engine.limits.tokenizer_thread == (where == "static_client")

    def broken(*args):
        raise RuntimeError("tokenizer failed")

    monkeypatch.setattr(inference.front_end.encoder, "encode_unchecked", broken)
    response = client.post("/predict", json={"inputs": "hello"})
    assert response.status_code == 424
    assert response.json() == {"error": "inference failed (RuntimeError: tokenizer failed)", "error_type": "Backend"}
    monkeypatch.undo()
    assert client.post("/predict", json={"inputs": "the engine survived"}).status_code == 200


def test_api_key_protects_the_tei_routes_only(smoke_checkpoint):
    with make_client(smoke_checkpoint, api_key="s3cret") as c:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            for path in ("/predict", "/", "/invocations"):
                response = c.post(path, json={"inputs": "x"}, headers=headers)
                assert response.status_code == 401 and response.json()["error_type"] == "Unauthorized"
            assert c.get("/info", headers=headers).status_code == 401
        good = {"Authorization": "Bearer s3cret"}
        assert c.post("/predict", json={"inputs": "x"}, headers=good).status_code == 200
        assert c.get("/info", headers=good).status_code == 200
        assert all(c.get(path).status_code == 200 for path in ("/health", "/", "/ping", "/ready", "/metrics"))


def test_request_ids_are_accepted_generated_and_echoed(client):
    given = client.post("/predict", json={"inputs": "x"}, headers={"X-Request-Id": "abc-123"})
    assert given.headers["x-request-id"] == "abc-123"
    generated = client.post("/predict", json={"inputs": "x"}).headers["x-request-id"]
    assert len(generated) == 32 and generated != client.post("/predict", json={"inputs": "x"}).headers["x-request-id"]
    unsafe = client.get("/health", headers={"X-Request-Id": "a\tb" + "x" * 200}).headers["x-request-id"]
    assert len(unsafe) == 32  # not echoed: replaced by a generated one


def test_cors_when_an_origin_is_allowed(smoke_checkpoint):
    with make_client(smoke_checkpoint, cors_allow_origin="https://app.example") as c:
        preflight = c.options(
            "/predict",
            headers={
                "Origin": "https://app.example",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type,authorization",
            },
        )
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == "https://app.example"
        answer = c.post("/predict", json={"inputs": "x"}, headers={"Origin": "https://app.example"})
        assert "x-compute-time" in answer.headers["access-control-expose-headers"]
        assert (
            c.options(
                "/predict", headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}
            ).status_code
            == 400
        )
    with make_client(smoke_checkpoint) as c:  # no CORS_ALLOW_ORIGIN: no CORS headers
        assert (
            "access-control-allow-origin"
            not in c.post("/predict", json={"inputs": "x"}, headers={"Origin": "https://app.example"}).headers
        )


def test_reload_swaps_in_a_new_checkpoint_and_refuses_a_broken_one(checkpoint_copy):
    with make_client(checkpoint_copy, backend="torch", reload_interval_s=0.1) as c:  # runtimes: test_runtimes
        before = c.get("/info").json()["distilbert_agnews"]["checkpoint"]
        weights = checkpoint_copy / files.WEIGHTS
        state = torch.load(weights, weights_only=True)
        state["classifier.bias"] = torch.tensor([0.0, 0.0, 0.0, 50.0])  # now everything is Sci/Tech
        save_new_weights(checkpoint_copy, state)  # what training does
        after = wait_for(
            lambda: c.get("/info").json()["distilbert_agnews"]["checkpoint"],
            lambda info: info["sha256"] != before["sha256"],
        )
        assert after["reloads"] == 1
        assert c.post("/predict", json={"inputs": TEXTS[1]}).json()[0]["label"] == "Sci/Tech"

        weights.write_bytes(weights.read_bytes()[:1000])  # truncated: must be refused
        wait_for(lambda: c.get("/metrics").text, lambda text: 'te_model_reloads{result="failed"} 1' in text)
        assert c.get("/info").json()["distilbert_agnews"]["checkpoint"]["sha256"] == after["sha256"]
        assert c.post("/predict", json={"inputs": TEXTS[1]}).json()[0]["label"] == "Sci/Tech"


class Exploit:
    """Unpickling this would run code: create a marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_checkpoints_that_are_not_plain_tensors_are_refused(checkpoint_copy, tmp_path):
    (checkpoint_copy / files.HF_WEIGHTS).unlink()  # no export to fall back on
    weights = checkpoint_copy / files.WEIGHTS
    marker = tmp_path / "code_ran"
    torch.save({"classifier.bias": Exploit(str(marker))}, weights)
    with pytest.raises(CheckpointError, match=files.WEIGHTS):
        load_model(str(checkpoint_copy), device="cpu", dtype="fp32")
    assert not marker.exists()
    weights.write_bytes(b"")
    with pytest.raises(CheckpointError, match=files.WEIGHTS):
        load_model(str(checkpoint_copy), device="cpu", dtype="fp32")
    weights.unlink()
    with pytest.raises(CheckpointError, match=f"{files.WEIGHTS}: missing"):
        load_model(str(checkpoint_copy), device="cpu", dtype="fp32")


def test_a_broken_checkpoint_stops_the_command_with_one_line(checkpoint_copy):
    weights = checkpoint_copy / files.WEIGHTS
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # truncated
    result = run_cli("--model_id", str(checkpoint_copy))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(weights) in lines[0] and lines[0].startswith("inference: error:"), result.stderr


def test_importing_the_app_module_builds_no_app():
    """The service starts through a factory: importing inference.app reads no setting and loads no model (with a
    MODEL_ID that does not exist, an import that built the app would fail)."""
    code = "import inference.app as m; assert 'app' not in vars(m); print('built nothing')"
    env = {**os.environ, "MODEL_ID": "/nonexistent/model", "PORT": "not-a-port"}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0 and "built nothing" in result.stdout, result.stderr[-2000:]


def test_serving_imports_nothing_from_training():
    code = "import sys, inference.app, inference.__main__; print([m for m in sys.modules if m.startswith('training')])"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr


def test_the_contract_package_imports_neither_side():
    """contract/ (file names, problem type, pooling, precision, Hub probe) is what training and serving share: it
    imports neither of them, so each side can depend on it."""
    code = (
        "import sys, contract.files, contract.problem_types, contract.long_text, contract.precision, contract.hub; "
        "print([m for m in sys.modules if m.split('.')[0] in ('training', 'inference')])"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr


def test_every_request_is_counted_with_the_status_its_client_saw(smoke_checkpoint):
    """te_http_responses{status}: 200, 401 (API key), 413 (Content-Length and chunked), 422, 429, 404."""

    def chunks():
        for _ in range(3):
            yield b" " * 1_000

    limits = {"max_concurrent_requests": 3, "max_client_batch_size": 3, "payload_limit": 2_000}
    with make_client(smoke_checkpoint, api_key="k", **limits) as c:
        good = {"Authorization": "Bearer k", **JSON}
        calls = [
            c.post("/predict", json={"inputs": "x"}, headers=good),
            c.post("/predict", json={"inputs": "x"}),
            c.post("/predict", content=b" " * 3_000, headers=good),
            c.post("/predict", content=chunks(), headers=good),
            c.post("/predict", json={"inputs": ["a", "b", "c"]}, headers=good),
            c.post("/predict", content=b"{not json", headers=good),
        ]
        with model_busy(c, {"inputs": [["a"], ["b"]]}, good) as first:
            calls.append(c.post("/predict", json={"inputs": [["c"], ["d"]]}, headers=good))
        calls += [first[0], c.get("/nowhere")]
        assert [r.status_code for r in calls] == [200, 401, 413, 413, 422, 400, 429, 200, 404]
        metrics = c.get("/metrics").text
    for status, count in {"200": 2, "401": 1, "413": 2, "422": 1, "400": 1, "429": 1, "404": 1}.items():
        assert f'te_http_responses{{status="{status}"}} {count}.0' in metrics, (status, metrics)
