"""Errors as TEI answers them: `{"error", "error_type"}` with TEI's names and statuses (router/src/lib.rs `ErrorType`,
router/src/http/server.rs). Ours beside them: 401, 404, 405, 413, 415.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

logger = logging.getLogger("inference")

EMPTY, VALIDATION, OVERLOADED, UNHEALTHY, BACKEND = "Empty", "Validation", "Overloaded", "Unhealthy", "Backend"
TOKENIZER = "Tokenizer"
MEDIA_TYPE = "UnsupportedMediaType"  # ours, as 401/404/405: TEI's framework answers 415 in plain text
STATUS = {EMPTY: 400, VALIDATION: 422, TOKENIZER: 422, OVERLOADED: 429, UNHEALTHY: 503, BACKEND: 424, MEDIA_TYPE: 415}
_HTTP_TYPES = {401: "Unauthorized", 404: "NotFound", 405: "MethodNotAllowed", 413: VALIDATION}
INPUTS_HELP = (
    'a string, a pair of strings ["text", "text_pair"], or a batch of single strings and pairs '
    '[["text 1"], ["text 2", "text_pair 2"], ...]'
)  # TEI's request shapes, in what a wrong `inputs` is told
CLIENT_CLOSED = 499  # nginx's "client closed": counted, never sent


class ServiceError(Exception):
    """An error answered with its TEI error type and status."""

    def __init__(
        self,
        error_type: str,
        message: str,
        status: int | None = None,
        reason: str | None = None,
        body: dict | None = None,
    ):
        super().__init__(message)
        self.error_type, self.message = error_type, message
        self.status = status or STATUS[error_type]
        self.reason = reason or error_type.lower()  # te_request_failure{err=...}
        self.body = body  # another API's error body (vLLM's), instead of TEI's


def error_response(status: int, error_type: str, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "error_type": error_type}, status_code=status)


def describe_validation(errors: list[dict], inputs_help: str = INPUTS_HELP) -> str:
    """`inputs: <why>` for pydantic's first problem, in one line."""
    if not errors:
        return "invalid request"
    first = errors[0]
    where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body",))
    field = where.split(".")[0] if where else "body"
    if field == "inputs" and first.get("type") != "value_error":
        return f"inputs: expected {inputs_help}"
    return f"{where or 'body'}: {first.get('msg', 'invalid').removeprefix('Value error, ')}"


def install(app: FastAPI) -> None:
    """Every error, ours or the framework's, in the same body."""

    @app.exception_handler(ServiceError)
    async def service_error(_: Request, exc: ServiceError):
        if exc.body is not None:
            return JSONResponse(exc.body, status_code=exc.status)
        return error_response(exc.status, exc.error_type, exc.message)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError):
        return error_response(422, VALIDATION, describe_validation(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException):
        return error_response(exc.status_code, _HTTP_TYPES.get(exc.status_code, "Http"), str(exc.detail))

    @app.exception_handler(ClientDisconnect)
    async def client_left(_: Request, exc: ClientDisconnect):
        # The client left: no answer, no traceback; counted as 499.
        logger.info("client went away before its answer")
        return Response(status_code=CLIENT_CLOSED)

    @app.exception_handler(Exception)
    async def internal_error(_: Request, exc: Exception):
        logger.error("unexpected error: %s: %s", type(exc).__name__, exc, exc_info=exc)
        return error_response(500, BACKEND, f"internal error ({type(exc).__name__})")
