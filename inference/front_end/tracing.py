"""OTLP_ENDPOINT: one OpenTelemetry span per HTTP request, exported over OTLP/HTTP. Added by app.py when set."""

from __future__ import annotations

import logging
import threading
import time

from inference.logs import request_id
from inference.settings import Settings, SettingsError

logger = logging.getLogger("inference")
CONTEXT_HEADERS = (b"traceparent", b"tracestate")  # what continues a caller's trace
TIMES = {  # response header (TEI's, in ms) -> span attribute
    b"x-tokenization-time": "te.tokenization_time_ms",
    b"x-queue-time": "te.queue_time_ms",
    b"x-inference-time": "te.inference_time_ms",
    b"x-total-time": "te.total_time_ms",
}


def require_sdk() -> None:
    """Which extra to install for OTLP_ENDPOINT."""
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        raise SettingsError(
            "OTLP_ENDPOINT: tracing needs the OpenTelemetry SDK: pip install 'distilbert-agnews[telemetry]'"
        ) from None


EXPORT_TIMEOUT_S = 2.0  # one export to the collector; the SDK's 10 s per try held shutdown past the pod's grace
UNTRACED = ("/health", "/ready", "/ping", "/metrics")  # probes and scrapes: every few seconds, nothing to learn


class Tracing:
    """The tracer exporting to settings.otlp_endpoint, and its bounded end."""

    def __init__(self, settings: Settings):
        require_sdk()
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        resource = Resource.create({"service.name": settings.otlp_service_name})
        self.provider = TracerProvider(resource=resource, shutdown_on_exit=False)  # ended by shut_down, bounded
        endpoint = settings.otlp_endpoint.rstrip("/")
        endpoint = endpoint if endpoint.endswith("/v1/traces") else f"{endpoint}/v1/traces"
        exporter = OTLPSpanExporter(endpoint=endpoint, timeout=EXPORT_TIMEOUT_S)
        self.provider.add_span_processor(BatchSpanProcessor(exporter, export_timeout_millis=EXPORT_TIMEOUT_S * 1000))
        self.tracer = self.provider.get_tracer("inference")

    def shut_down(self, within_s: float = EXPORT_TIMEOUT_S) -> None:
        """Send the last spans if the collector takes them within `within_s`; never hold the exit longer."""
        ending = threading.Thread(target=self.provider.shutdown, name="traces-shutdown", daemon=True)
        ending.start()
        ending.join(within_s)
        if ending.is_alive():
            logger.warning("Traces: the collector did not take the last spans within %gs; they are dropped", within_s)


class Traces:
    """ASGI middleware: a span per request, probes and scrapes left out."""

    def __init__(self, app, tracer):
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.app, self.tracer, self.trace = app, tracer, trace
        # W3C trace context only: the baggage propagator logs a whole oversized header, and nothing here reads baggage
        self.extract = TraceContextTextMapPropagator().extract

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in UNTRACED:
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"] if k in CONTEXT_HEADERS}
        started = time.time_ns()
        answer: dict = {}

        async def send_observed(message):
            if message["type"] == "http.response.start":
                answer["status"] = message["status"]
                answer["headers"] = dict(message.get("headers", []))
            await send(message)

        try:
            await self.app(scope, receive, send_observed)
        finally:
            self.export(scope, headers, answer, started)

    def export(self, scope, headers: dict, answer: dict, started: int) -> None:
        route = getattr(scope.get("route"), "path", None) or scope["path"]
        context, kind = self.extract(headers), self.trace.SpanKind.SERVER
        span = self.tracer.start_span(f"{scope['method']} {route}", context=context, start_time=started, kind=kind)
        span.set_attribute("http.request.method", scope["method"])
        span.set_attribute("http.route", route)
        span.set_attribute("http.response.status_code", answer.get("status", 499))  # 499: the client left first
        span.set_attribute("te.request_id", request_id.get())  # RequestId, outside, set it for this request
        said = answer.get("headers", {})
        for header, attribute in TIMES.items():
            if header in said and said[header].isdigit():
                span.set_attribute(attribute, int(said[header]))
        if answer.get("status", 500) >= 500:
            span.set_status(self.trace.Status(self.trace.StatusCode.ERROR))
        span.end()
