"""ASGI middleware: the status count, the request id and the body-size limit, before any route runs."""

from __future__ import annotations

import re
import uuid

from inference.errors import CLIENT_CLOSED, VALIDATION, error_response
from inference.logs import request_id

_SAFE_ID = re.compile(r"^[\w.:/+=-]{1,128}$")


class ResponseStatus:
    """Counts every HTTP request by the status its client saw, whichever layer answered: a route, the API key
    check (401), the body limit (413), admission (429), an unexpected error (500); 499 when the client left
    first. Outermost, so nothing answers around it."""

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
        except Exception:
            status = status or 500
            raise
        finally:
            scope["app"].state.service.metrics.responses.labels(str(status or CLIENT_CLOSED)).inc()


class RequestId:
    """Accept the client's X-Request-Id (up to 128 safe characters) or generate one; echo it in the response and
    put it in every log line of the request."""

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
    """413 for bodies over the limit, by Content-Length or while streaming (chunked uploads)."""

    class TooLarge(Exception):
        pass

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        too_large = error_response(
            413, VALIDATION, f"request body is larger than PAYLOAD_LIMIT ({self.max_bytes} bytes)"
        )
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await too_large(scope, receive, send)
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise BodySizeLimit.TooLarge
            return message

        try:
            await self.app(scope, limited_receive, send)
        except BodySizeLimit.TooLarge:
            await too_large(scope, receive, send)
