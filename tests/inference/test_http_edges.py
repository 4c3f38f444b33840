"""The edges operators and TEI clients hit, over real HTTP."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request

import pytest

from contract import files
from inference.app import create_app
from inference.front_end import routes, text_routes
from inference.settings import Settings, SettingsError, from_env
from tests.helpers.processes import cli_env
from tests.helpers.service import run_cli
from tests.inference.test_app import TEXTS, make_client


def stdlib_post(port: int, body: bytes) -> tuple[int, dict, dict]:
    """One POST with urllib.request, the standard library's client: it sends `Connection: close` and the whole body
    before it reads the answer."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/predict", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers), json.loads(response.read())
    except urllib.error.HTTPError as answer:  # 4xx and 5xx: the answer is still read
        return answer.code, dict(answer.headers), json.loads(answer.read() or b"null")


@pytest.mark.slow  # a real server process
def test_an_over_limit_body_reaches_the_standard_library_client_as_413_every_time(server):
    """The unread body is drained before a 413."""
    body = json.dumps({"inputs": "x" * 3_000_000}).encode()  # 3 MB against PAYLOAD_LIMIT's 2,000,000 bytes
    for _ in range(10):
        status, headers, answer = stdlib_post(server.port, body)
        assert status == 413 and headers.get("connection") == "close"  # header names as the server sent them
        assert answer == {
            "error": "request body is larger than PAYLOAD_LIMIT (2000000 bytes)",
            "error_type": "Validation",
        }
    status, _, answer = stdlib_post(server.port, json.dumps({"inputs": TEXTS[0]}).encode())
    assert status == 200 and len(answer) == 4


@pytest.mark.slow  # a real server process
def test_request_ids_are_ascii_and_echoed_byte_for_byte(server):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        for given, echoed in [(b"trace-42:a/b+c=d", True), ("caf\u00e9-1".encode(), False), (b"\xff\xfe", False)]:
            connection.putrequest("GET", "/health")
            connection.putheader("X-Request-Id", given)
            connection.endheaders()
            response = connection.getresponse()
            response.read()
            raw = [v for k, v in response.msg.raw_items() if k.lower() == "x-request-id"]
            assert len(raw) == 1 and response.status == 200
            got = raw[0].encode("latin-1")  # http.client decodes header bytes as latin-1: this undoes it
            assert (got == given) == echoed and got.isascii(), (given, got)
            assert echoed or len(got) == 32  # a non-ASCII id is replaced by a generated one
    finally:
        connection.close()


@pytest.mark.parametrize("key", ["cl\u00e9", "with space", "tab\there", "\u5bc6\u94a5"])
def test_a_non_ascii_or_spaced_api_key_is_refused_at_start_without_echoing_it(key):
    with pytest.raises(SettingsError) as refused:
        from_env(api_key=key)
    assert str(refused.value).startswith("API_KEY: must be printable ASCII without spaces") and key not in str(refused)


def test_api_key_from_the_environment_refused_by_the_real_command():
    result = run_cli(env=cli_env(API_KEY="cl\u00e9"))
    assert result.returncode == 2 and result.stderr.startswith("inference: error: API_KEY: must be printable ASCII")
    assert len(result.stderr.splitlines()) == 1 and "cl\u00e9" not in result.stderr


def every_route(app) -> list[tuple[str, str, bool]]:
    """(method, path, guarded by the API key) of every route the app answers, included routers expanded."""
    found = []
    for route in app.routes:
        router = getattr(route, "original_router", None)  # FastAPI's included routers; the docs are plain routes
        for inner in router.routes if router is not None else [route]:
            for method in sorted(set(inner.methods) - {"HEAD"}):
                fast = (routes.predict_fast, text_routes.root_fast)  # check the key themselves
                keyed = any(d.dependency is routes.require_api_key for d in getattr(router, "dependencies", ()))
                guarded = keyed or getattr(inner, "endpoint", None) in fast
                found.append((method, inner.path, guarded))
    return found


def test_every_route_open_without_the_key_is_named_in_the_settings_help(smoke_checkpoint):
    """Found, not listed: every route of the app is called without a key; those outside the guarded router must
    answer and be named in API_KEY's description (what --help prints); the guarded ones must answer 401."""
    help_text = Settings.model_fields["api_key"].description
    app = create_app(Settings(model_id=str(smoke_checkpoint), api_key="k", reload_interval_s=0, dtype="fp32"))
    found = every_route(app)
    assert {path for _, path, _ in found} >= {"/predict", "/info", "/health", "/metrics", "/docs", "/openapi.json"}
    with make_client(smoke_checkpoint, api_key="k") as c:
        for method, path, guarded in found:
            response = c.request(method, path, json={"inputs": "x"} if method == "POST" else None)
            if guarded:
                assert response.status_code == 401, (method, path)
            else:
                assert response.status_code != 401 and path in help_text, (method, path, help_text)


def test_te_predict_count_counts_inputs_as_tei_does(smoke_checkpoint):
    """TEI counts te_predict_count and te_predict_success once per input handed to the model (core/src/infer.rs,
    `Infer::predict`, called once per input of a batch by router/src/http/server.rs)."""
    with make_client(smoke_checkpoint) as c:
        c.post("/predict", json={"inputs": TEXTS[0]})
        c.post("/predict", json={"inputs": [[TEXTS[1]], [TEXTS[2], TEXTS[3]], [TEXTS[0]]]})
        c.post("/predict", json={"inputs": [["ok"]] * 33})  # over MAX_CLIENT_BATCH_SIZE: never handed to the model
        metrics = c.get("/metrics").text
    assert "te_predict_count 4.0" in metrics and "te_predict_success 4.0" in metrics, metrics


def mislabel(folder, n: int = 5) -> None:
    config = json.loads((folder / files.CONFIG).read_text())
    config["id2label"] = {str(i): f"topic {i}" for i in range(n)}
    config["label2id"] = {f"topic {i}": i for i in range(n)}
    (folder / files.CONFIG).write_text(json.dumps(config))


@pytest.mark.parametrize("weights", ["state_dict", "safetensors"])
def test_an_id2label_of_another_size_than_the_head_is_one_line_for_every_format(checkpoint_copy, weights):
    """Our distilbert_agnews.pt (a traceback before) and a save_pretrained folder's model.safetensors."""
    if weights == "safetensors":
        (checkpoint_copy / files.WEIGHTS).unlink()
    mislabel(checkpoint_copy)
    result = run_cli("--model_id", str(checkpoint_copy), "--backend", "torch")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("inference: error:") and f"does not match {files.CONFIG}: classifier." in line
    assert "[4" in line and "[5" in line and "5 labels in its id2label" in line


@pytest.mark.slow  # a real server process
def test_the_real_server_answers_malformed_json_400(server):
    status, _, answer = stdlib_post(server.port, b'{"inputs": ')
    assert status == 400 and answer["error_type"] == "Validation" and "not valid JSON" in answer["error"]
    assert stdlib_post(server.port, b'{"inputs": 3}')[0] == 422
