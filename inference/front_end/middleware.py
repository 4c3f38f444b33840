"""ASGI middleware: status count, request id and body limit, before any route."""

from __future__ import annotations

import asyncio
import logging
import re
import uuid

from inference.logs import request_id
from inference.tei_errors import CLIENT_CLOSED, UNHEALTHY, VALIDATION, error_response

logger = logging.getLogger("inference")

_SAFE_ID = re.compile(r"^[\w.:/+=-]{1,128}$", re.ASCII)  # ASCII only: echoed byte for byte in a header
DRAIN_BYTES, DRAIN_S = 64 * 1024 * 1024, 10.0  # read and dropped before the 413


class ResponseStatus:
    """Counts every response by status, whoever answered; 499 when the client left. Outermost."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = None

        async def send_recording_status(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_recording_status)
        except asyncio.CancelledError:
            # cancelled at shutdown: a 503, not a traceback
            logger.info("a request still running at the end of the graceful shutdown was stopped")
            if status is None:
                status = 503
                message = "the service stopped before this request finished (GRACEFUL_SHUTDOWN_S)"
                await error_response(503, UNHEALTHY, message)(scope, receive, send)
        except Exception:
            status = status or 500
            raise
        finally:
            scope["app"].state.service.metrics.responses.labels(str(status or CLIENT_CLOSED)).inc()


class RequestId:
    """The client's X-Request-Id or a new one, echoed and logged."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        rid = given if _SAFE_ID.match(given) else uuid.uuid4().hex
        token = request_id.set(rid)

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            request_id.reset(token)


class BodySizeLimit:
    """413 for bodies over the limit, by Content-Length or while streaming (chunked uploads).

    The client is still sending when the 413 is ready: closing then would make the kernel reset the connection, and
    most clients (Python's http.client among them) would report "connection reset" instead of the answer. So the rest
    of the body is read and dropped first, up to DRAIN_BYTES and DRAIN_S, and the answer closes the connection."""

    class TooLarge(Exception):
        pass

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            if headers.get(b"expect", b"").lower() != b"100-continue":  # else the client waits: nothing to drain
                await drain(receive)
            return await self.too_large(scope, receive, send)
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                if message.get("more_body"):
                    await drain(receive)
                raise BodySizeLimit.TooLarge
            return message

        try:
            await self.app(scope, limited_receive, send)
        except BodySizeLimit.TooLarge:
            await self.too_large(scope, receive, send)

    async def too_large(self, scope, receive, send):
        response = error_response(
            413, VALIDATION, f"request body is larger than PAYLOAD_LIMIT ({self.max_bytes} bytes)"
        )
        response.headers["connection"] = "close"
        await response(scope, receive, send)


async def drain(receive) -> None:
    """Read and drop the rest of a request body, at most DRAIN_BYTES within DRAIN_S seconds."""
    loop, read = asyncio.get_running_loop(), 0
    deadline = loop.time() + DRAIN_S
    while read <= DRAIN_BYTES:
        try:
            message = await asyncio.wait_for(receive(), timeout=max(deadline - loop.time(), 0))
        except TimeoutError:
            return
        if message["type"] != "http.request" or not message.get("more_body"):
            return
        read += len(message.get("body", b""))
