"""Metrics and OTLP traces over real HTTP."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.helpers.processes import ROOT, cli_env
from tests.helpers.service import Server, run_cli, wait_for

pytestmark = pytest.mark.slow


def test_api_metrics_false_keeps_the_metrics_off_the_api_port(smoke_checkpoint):
    """The private port with several workers: tests/inference/test_workers.py (one 2-worker server for both)."""
    from fastapi.testclient import TestClient

    from inference.app import create_app
    from inference.settings import Settings

    for api_metrics, status in ((True, 200), (False, 404)):
        settings = Settings(model_id=str(smoke_checkpoint), prometheus_port=9, api_metrics=api_metrics)
        with TestClient(create_app(settings)) as client:
            assert client.get("/metrics").status_code == status
            assert client.post("/predict", json={"inputs": "stocks fell"}).status_code == 200


def test_a_taken_port_or_metrics_served_nowhere_stops_start_up_in_one_line(smoke_checkpoint):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        metrics = run_cli("--model_id", str(smoke_checkpoint), "--prometheus_port", str(port))
        api = run_cli("--model_id", str(smoke_checkpoint), "--port", str(port))
    assert metrics.returncode == 2 and "Traceback" not in metrics.stderr and "Ready:" not in metrics.stderr
    assert metrics.stderr.strip().startswith(f"inference: error: PROMETHEUS_PORT: cannot listen on 127.0.0.1:{port}")
    assert api.returncode == 2 and api.stderr.strip() == (
        f"inference: error: PORT: cannot listen on 127.0.0.1:{port} (Address already in use)"
    )  # said before the model loads, not after it in uvicorn's log
    result = run_cli("--model_id", str(smoke_checkpoint), "--no-api_metrics")
    assert result.returncode == 2 and "API_METRICS: false needs PROMETHEUS_PORT" in result.stderr


class Receiver:
    """An OTLP/HTTP trace receiver on 127.0.0.1 (POST /v1/traces, protobuf), keeping every span it is sent."""

    def __init__(self):
        self.spans, self.resources = [], []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers["content-length"]))
                request = ExportTraceServiceRequest.FromString(body)
                for resource_spans in request.resource_spans:
                    receiver.resources.append(resource_spans.resource)
                    for scope in resource_spans.scope_spans:
                        receiver.spans.extend(scope.spans)
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def attributes(span) -> dict:
    return {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in span.attributes}


def test_each_request_exports_a_span_with_tei_times_to_an_otlp_receiver(smoke_checkpoint):
    receiver = Receiver()
    env = cli_env(OTEL_BSP_SCHEDULE_DELAY="100")  # the SDK's batch interval, shortened for the test
    server = Server(
        smoke_checkpoint, "--otlp_endpoint", receiver.url, "--otlp_service_name", "agnews-test", env=env
    ).wait_ready()
    try:
        trace_id = "0af7651916cd43dd8448eb211c80319c"
        answer = httpx.post(
            f"{server.url}/predict",
            json={"inputs": "stocks fell sharply"},
            headers={"x-request-id": "req-42", "traceparent": f"00-{trace_id}-b7ad6b7169203331-01"},
        )
        assert answer.status_code == 200
        assert httpx.post(f"{server.url}/predict", json={"inputs": ""}).status_code == 400
        for probe in ("/health", "/ready", "/ping", "/metrics"):  # every few seconds in a cluster: never traced
            assert httpx.get(f"{server.url}{probe}").status_code == 200
        baggage = ",".join(f"k{i}=v{i}" for i in range(5000))  # was copied whole into the log by the propagator
        assert (
            httpx.post(f"{server.url}/predict", json={"inputs": "x"}, headers={"baggage": baggage}).status_code == 200
        )
        spans = wait_for(lambda: list(receiver.spans), lambda s: len([x for x in s if "predict" in x.name]) >= 3)
    finally:
        server.stop()
        receiver.server.shutdown()
    assert {s.name for s in spans} == {"POST /predict"}
    assert "k4999" not in server.output()
    predict = [s for s in spans if attributes(s).get("te.request_id") == "req-42"]
    assert len(predict) == 1
    span, said = predict[0], attributes(predict[0])
    assert span.name == "POST /predict" and span.trace_id.hex() == trace_id  # continues the caller's trace
    assert said["http.response.status_code"] == 200 and said["http.request.method"] == "POST"
    headers = {"te.tokenization_time_ms": "x-tokenization-time", "te.queue_time_ms": "x-queue-time"}
    headers |= {"te.inference_time_ms": "x-inference-time", "te.total_time_ms": "x-total-time"}
    for attribute, header in headers.items():  # the times TEI's headers report, as the client saw them
        assert said[attribute] == int(answer.headers[header])
    assert span.end_time_unix_nano > span.start_time_unix_nano
    refused = [s for s in spans if attributes(s).get("http.response.status_code") == 400]
    assert len(refused) == 1 and refused[0].trace_id.hex() != trace_id
    service_names = {a.value.string_value for r in receiver.resources for a in r.attributes if a.key == "service.name"}
    assert service_names == {"agnews-test"}


def test_tracing_is_absent_from_the_request_path_unless_asked(smoke_checkpoint):
    from inference.app import create_app
    from inference.front_end.tracing import Traces
    from inference.settings import Settings

    def middleware(**settings) -> list:
        app = create_app(Settings(model_id=str(smoke_checkpoint), **settings))
        return [m.cls for m in app.user_middleware]

    assert Traces not in middleware()
    assert Traces in middleware(otlp_endpoint="http://127.0.0.1:4318")


def test_tracing_without_the_sdk_installed_stops_in_one_line(smoke_checkpoint):
    program = (  # the SDK made unimportable, as on an install without the telemetry extra
        "import sys; sys.modules['opentelemetry.sdk'] = None; from inference.__main__ import main; "
        f"sys.exit(main(['--model_id', {str(smoke_checkpoint)!r}, '--otlp_endpoint', 'http://127.0.0.1:4318']))"
    )
    result = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == (
        "inference: error: OTLP_ENDPOINT: tracing needs the OpenTelemetry SDK: pip install "
        "'distilbert-agnews[telemetry]'"
    )


def test_a_collector_that_never_answers_delays_no_exit_and_json_output_stays_json(smoke_checkpoint):
    """A silent collector no longer holds shutdown."""
    import json

    from inference.front_end.tracing import EXPORT_TIMEOUT_S

    silent = socket.create_server(("127.0.0.1", 0))  # accepts (the kernel's backlog), never reads or answers
    url = f"http://127.0.0.1:{silent.getsockname()[1]}"
    env = cli_env(OTEL_BSP_SCHEDULE_DELAY="100", JSON_OUTPUT="true")
    server = Server(smoke_checkpoint, "--otlp_endpoint", url, env=env).wait_ready()
    try:
        for _ in range(3):
            assert httpx.post(f"{server.url}/predict", json={"inputs": "stocks fell"}).status_code == 200
        time.sleep(0.5)  # a batch is on its way to the silent collector
        server.process.terminate()
        started = time.time()
        assert server.exit_code(60) == 0, server.output()
        took = time.time() - started
    finally:
        server.stop()
        silent.close()
    print(f"exit {took:.1f} s after SIGTERM with a silent collector")
    assert took < 4 * EXPORT_TIMEOUT_S + 4, server.output()  # an export in flight, then the bounded shutdown
    lines = [line for line in server.output().splitlines() if line.strip()]
    assert lines and all(json.loads(line) for line in lines), [line for line in lines if not line.startswith("{")]
