"""PROMETHEUS_PORT: GET /metrics on a private port of its own, served by the standard library's HTTP server from the
process that outlives the workers.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from contract.errors import UsageError

logger = logging.getLogger("inference")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # Prometheus' text format, as the API port serves it


def start(host: str, port: int, exposition: Callable[[], str]) -> ThreadingHTTPServer:
    """Serve /metrics from a daemon thread; a taken port stops start-up."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the standard library's name
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_error(404)
                return
            body = exposition().encode()
            self.send_response(200)
            self.send_header("content-type", CONTENT_TYPE)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - the standard library's signature
            pass  # a scrape every few seconds is no news

    try:
        server = ThreadingHTTPServer((host, port), Handler)
    except OSError as exc:
        raise UsageError(f"PROMETHEUS_PORT: cannot listen on {host}:{port} ({exc.strerror or exc})") from None
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics-port", daemon=True).start()
    logger.info("Metrics on http://%s:%d/metrics", host, server.server_address[1])
    return server
