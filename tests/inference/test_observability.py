"""What a cluster scrapes and traces, over real HTTP: PROMETHEUS_PORT serves every worker's metrics on a port of its
own while API_METRICS=false keeps them off the public one; OTLP_ENDPOINT exports one span per request to a local
OTLP/HTTP receiver (the collector's protocol, decoded with opentelemetry-proto); a taken port or a missing SDK stops
start-up in one line."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.processes import ROOT, cli_env, free_port
from tests.helpers.service import Server, run_cli, wait_for

pytestmark = pytest.mark.slow


def counted(text: str, name: str, labels: dict) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return 0.0


def test_two_workers_serve_their_metrics_on_the_private_port_only(smoke_checkpoint):
    metrics_port = free_port()
    server = Server(
        smoke_checkpoint,
        *("--workers", "2", "--dtype", "float32", "--reload_interval_s", "0"),
        *("--prometheus_port", str(metrics_port), "--no-api_metrics"),
    ).wait_ready()
    try:
        wait_for(server.output, lambda out: out.count("Ready:") == 2, timeout=90)  # both workers loaded
        for i in range(20):  # a new connection each time: the kernel hands them to either worker
            with httpx.Client(base_url=server.url) as client:
                assert client.post("/predict", json={"inputs": f"stocks fell {i}"}).status_code == 200
        assert httpx.get(f"{server.url}/metrics").status_code == 404  # off the public port
        scrape = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics")
        assert scrape.status_code == 200 and scrape.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert counted(scrape.text, "te_request_success_total", {"method": "single"}) == 20
        pids = {
            s.labels["pid"]
            for f in text_string_to_metric_families(scrape.text)
            for s in f.samples
            if s.name == "te_process_resident_memory_bytes"
        }
        assert len(pids) == 2, "both workers' metrics"
        assert httpx.get(f"http://127.0.0.1:{metrics_port}/predict").status_code == 404  # metrics only
    finally:
        server.stop()
    assert server.process.returncode == 0


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
        spans = wait_for(lambda: list(receiver.spans), lambda s: len([x for x in s if "predict" in x.name]) >= 2)
    finally:
        server.stop()
        receiver.server.shutdown()
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
    from inference.settings import Settings
    from inference.tracing import Traces

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
