"""The routes, thin: parse, ask the engine, answer. TEI's paths (router/src/http/server.rs) plus GET /ready."""

from __future__ import annotations

import asyncio
import hmac
import re
import time
from collections.abc import Awaitable, Callable
from contextlib import contextmanager
from typing import TypeVar

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect
from starlette.routing import Route

from contract import precision
from contract.long_text import CHUNK, TRUNCATE
from inference import tei_errors
from inference.answers import Answer, ModelView, Refused, Stale, failure
from inference.front_end import json_bounds
from inference.front_end.link import AppState
from inference.front_end.schemas import ErrorBody, Info, Json, PredictRequest, PredictResponse
from inference.tei_errors import ServiceError

VERSION = "0.1.0"
CHARS_PER_TOKEN_LIMIT = 250  # TEI's MAX_CHAR_MULTIPLIER: longer inputs are cut (truncate) or refused, untokenized
T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
JSON_CONTENT_TYPE = re.compile(r"application/(json|[^;\s]+\+json)\s*(;|$)", re.IGNORECASE)  # axum's json_content_type
_bearer = HTTPBearer(auto_error=False, description="The API_KEY setting, when the service has one.")


def service(request: Request) -> AppState:
    return request.app.state.service


def live_view(state: AppState) -> ModelView:
    """The served model, or 503 while none serves (loading, or the engine stopped)."""
    view = state.link.view
    if view is None:
        raise tei_errors.ServiceError(
            tei_errors.UNHEALTHY, state.link.why_not_serving() or "the model is not loaded yet"
        )
    return view


async def require_api_key(
    request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)
) -> None:
    check_api_key(request, credentials.credentials if credentials else None)


def check_api_key(request: Request, token: str | None) -> None:
    key = service(request).settings.api_key
    if key and (token is None or not hmac.compare_digest(token.encode(), key.encode())):
        raise ServiceError("Unauthorized", "missing or wrong API key (Authorization: Bearer <key>)", status=401)


def bearer_token(request: Request) -> str | None:
    """The token of an `Authorization: Bearer` header."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token if scheme.lower() == "bearer" and token else None


def guarded() -> APIRouter:
    """A router whose routes need the API key, as TEI guards its routes."""
    return APIRouter(dependencies=[Depends(require_api_key)])


router = guarded()
public = APIRouter()  # ... and not these
described = guarded()  # POST /predict for the schema only (with its key): served by the Starlette route of fast_routes
metrics_router = APIRouter()  # PROMETHEUS_PORT serves it when API_METRICS=false
ERROR_RESPONSES = {code: {"model": ErrorBody} for code in (400, 401, 413, 415, 422, 424, 429, 503)}


PREDICT_PATHS = ("/predict", "/", "/invocations")  # TEI's; on every fast route


@described.post(
    PREDICT_PATHS[0],
    response_model=PredictResponse,
    responses=ERROR_RESPONSES,
    summary="Classify texts and text pairs",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": PredictRequest.model_json_schema()}},
        }
    },
)
async def predict(request: Request) -> Response:
    state, started = service(request), time.perf_counter()
    require_json(request)
    with failures_counted(state):
        body = parse(state, await request.body())
        state.metrics.request_count.labels("batch" if body.is_batch else "single").inc()
        answer = await answered(request, classify(state, body))
    count_answer(state, answer, started, "batch" if body.is_batch else "single")
    k = body.k()
    ranked = [row[:k] for row in answer.ranked] if k else answer.ranked
    headers = tei_headers(answer, sum(len(a) + len(b or "") for a, b in body.sequences()), started)
    return Json(ranked if body.is_batch else ranked[0], headers=headers)


async def predict_fast(request: Request) -> Response:
    """`predict` behind the API key check."""
    check_api_key(request, bearer_token(request))
    return await predict(request)


def fast_routes(root: Callable[[Request], Awaitable[Response]] = predict_fast) -> list[Route]:
    """POST /predict, / and /invocations as plain Starlette routes: FastAPI's per-request machinery cost more than the
    request (docs/benchmarks-log.md). `described` gives /predict's schema."""
    return [Route(PREDICT_PATHS[0], predict_fast, methods=["POST"])] + [
        Route(path, root, methods=["POST"]) for path in PREDICT_PATHS[1:]
    ]


async def answered(request: Request, job: asyncio.Future[Answer]) -> Answer:
    """The job's Answer, or its failure as TEI answers it."""
    try:
        return await unless_gone(request, job)
    except ClientDisconnect:
        raise
    except Exception as exc:  # noqa: BLE001 - what the engine answered the job with, as TEI answers it
        raise engine_failure(exc) from None


async def unless_gone(request: Request, job: asyncio.Future[T]) -> T:
    """The job's result, unless the client disconnects first: then the job is cancelled (a 499)."""
    gone = asyncio.ensure_future(_disconnected(request.receive))
    gone.add_done_callback(lambda _: job.cancel())
    try:
        result = await job
    except asyncio.CancelledError:
        if gone.done() and not gone.cancelled():
            raise ClientDisconnect from None
        raise  # this request itself was cancelled (shutdown): so was its job
    finally:
        gone.cancel()
    if gone.done() and not gone.cancelled():
        raise ClientDisconnect
    return result


async def _disconnected(receive) -> None:
    """Returns when the client is gone."""
    while (await receive())["type"] != "http.disconnect":
        pass


def require_json(request: Request) -> None:
    """415 for a body not sent as JSON, as TEI's axum extractor answers."""
    if not JSON_CONTENT_TYPE.match(request.headers.get("content-type", "")):
        raise ServiceError(tei_errors.MEDIA_TYPE, "Expected request with `Content-Type: application/json`", status=415)


def parse(state: AppState, raw: bytes, model: type[M] = PredictRequest) -> M:
    """The body as TEI's request `model`: not JSON is 400, the wrong shape 422, more values than a request of
    MAX_CLIENT_BATCH_SIZE inputs carries 422 before any is built."""
    json_bounds.check(raw, state.settings.max_client_batch_size, getattr(model, "token_ids", False))
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        problems = exc.errors(include_url=False)
        if problems and problems[0]["type"] == "json_invalid":  # TEI (axum's JsonSyntaxError): 400, not 422
            raise ServiceError(
                tei_errors.VALIDATION, f"the body is not valid JSON ({problems[0]['msg']})", status=400, reason="json"
            ) from None
        help_text = getattr(model, "inputs_help", tei_errors.INPUTS_HELP)
        raise ServiceError(tei_errors.VALIDATION, tei_errors.describe_validation(problems, help_text)) from None


def classify(state: AppState, body: PredictRequest) -> asyncio.Future[Answer]:
    """Check the request and queue it."""
    return queue_sequences(state, body.sequences(), body.is_batch, body.truncate, body.left, body.scoring())


def queue_sequences(
    state: AppState,
    sequences: list,
    is_batch: bool,
    asked_truncate: bool | None,
    left: bool,
    scoring: str | None,
    adapter: str | None = None,
    special: bool = True,
) -> asyncio.Future[Answer]:
    """Inputs checked against the limits and queued, for the served model or its adapter of that name; `special`
    False for texts rendered whole (a chat template's): no special tokens or prompt template added, no windows."""
    settings = state.settings
    if is_batch:
        check_batch_size(settings, len(sequences))
    for i, (text, pair) in enumerate(sequences):
        if not text and not pair:  # TEI: only a zero-length input is empty; whitespace is classified
            raise ServiceError(tei_errors.EMPTY, "`inputs` cannot be empty" + (f" (inputs[{i}])" if is_batch else ""))
    served = live_view(state).named(adapter)
    # chunking unless the request asks to truncate
    chunk = served.chunks and asked_truncate is not True and special
    truncate = settings.auto_truncate if asked_truncate is None else asked_truncate
    if chunk:
        check_characters(sequences, served.window * settings.max_chunks * CHARS_PER_TOKEN_LIMIT)
    else:
        sequences = limit_characters(sequences, served.max_length * CHARS_PER_TOKEN_LIMIT, truncate, left)
    state.metrics.predict_count.inc(len(sequences))  # TEI: one per input handed to the model (core/src/infer.rs)
    options = (truncate, left, chunk, settings.max_chunks, special)
    return asyncio.ensure_future(encoded_and_answered(state, served, adapter, sequences, options, scoring))


async def encoded_and_answered(
    state: AppState, view: ModelView, adapter: str | None, sequences: list, options: tuple, scoring: str | None
) -> Answer:
    """The inputs tokenized here and their ids answered by the engine; encoded once more if a reload changed what
    encodes them while they waited (the engine refused them as stale)."""
    try:
        return await _answered_once(state, view, adapter, sequences, options, scoring, fresh=False)
    except (Stale, Refused) as exc:
        if failure(exc)[0] != "stale":
            raise
    return await _answered_once(state, view, adapter, sequences, options, scoring, fresh=True)


async def _answered_once(state, view, adapter, sequences, options, scoring, fresh: bool) -> Answer:
    encoded = await state.encoders.encode(view, adapter, sequences, options, fresh)
    for ids in encoded.ids:
        state.metrics.input_length.observe(len(ids))
    job = state.link.submit(encoded, scoring, adapter)
    try:
        answer = await job
    except asyncio.CancelledError:  # the client left: its job is dropped too
        job.cancel()
        raise
    answer.tokenization_s = encoded.seconds
    return answer


def check_batch_size(settings, size: int) -> None:
    """TEI's MAX_CLIENT_BATCH_SIZE check."""
    if size > settings.max_client_batch_size:
        raise ServiceError(
            tei_errors.VALIDATION,
            f"batch size {size} > maximum allowed batch size {settings.max_client_batch_size}",
            reason="batch_size",
        )


def engine_failure(exc: BaseException) -> ServiceError:
    """A job's failure as TEI answers it."""
    return failure_error(*failure(exc))


def failure_error(kind: str, message: str) -> ServiceError:
    """A failure the engine reported (answers.failure) as TEI answers it."""
    if kind == "overloaded":
        return ServiceError(tei_errors.OVERLOADED, message)
    if kind == "too_many_windows":
        return ServiceError(tei_errors.VALIDATION, message, status=413, reason="too_many_windows")
    if kind == "no_tokens":  # TEI's answer to a zero-length input
        return ServiceError(tei_errors.EMPTY, message, reason="validation")
    if kind in ("too_long", "long_text"):
        return ServiceError(tei_errors.VALIDATION, message)
    return ServiceError(tei_errors.BACKEND, message, reason="backend")  # TEI: 424 Backend, "score is NaN" likewise


def check_characters(sequences: list, limit: int) -> None:
    """Refuse, untokenized, an input too long for MAX_CHUNKS."""
    for text, pair in sequences:
        chars = len(text) + len(pair or "")
        if chars > limit:
            raise ServiceError(
                tei_errors.VALIDATION,
                f"an input of {chars} characters is more than MAX_CHUNKS windows can hold (at most {limit})",
                status=413,
                reason="too_many_windows",
            )


def limit_characters(sequences: list, limit: int, truncate: bool, left: bool) -> list:
    """TEI's character bound: each input cut to `limit` characters (pairs: half each), or refused."""
    cut: dict[tuple[int, int], str] = {}

    def keep(side: str, chars: int) -> str:
        if (id(side), chars) not in cut:
            cut[id(side), chars] = side[-chars:] if left else side[:chars]
        return cut[id(side), chars]

    out = []
    for text, pair in sequences:
        chars = len(text) + len(pair or "")
        if chars <= limit:
            out.append((text, pair))
        elif not truncate:
            raise ServiceError(
                tei_errors.VALIDATION, f"`inputs` must have less than {limit} characters. Given: {chars}"
            )
        else:
            side = limit // 2 if pair is not None else limit
            out.append((keep(text, side), keep(pair, side) if pair is not None else None))
    return out


@contextmanager
def failures_counted(state: AppState):
    """te_request_failure{err} for a ServiceError raised in the block, which goes on up."""
    try:
        yield
    except ServiceError as exc:
        state.metrics.request_failure.labels(exc.reason).inc()
        raise


def count_answer(state: AppState, answer: Answer, started: float, method: str = "batch") -> None:
    """TEI's success counters and durations for an answered request."""
    state.metrics.request_success.labels(method).inc()
    state.metrics.predict_success.inc(len(answer.ranked))
    observe(state, answer, time.perf_counter() - started)


def observe(state: AppState, answer: Answer, total_s: float) -> None:
    m = state.metrics
    m.request_duration.observe(total_s)
    m.tokenization_duration.observe(answer.tokenization_s)
    m.queue_duration.observe(answer.queue_s)
    m.inference_duration.observe(answer.inference_s)


def tei_headers(answer: Answer, characters: int, started: float) -> dict[str, str]:
    """TEI's response headers (router/src/lib.rs `From<ResponseMetadata> for HeaderMap`), times in ms."""
    total_ms = str(int((time.perf_counter() - started) * 1000))
    return {
        "x-compute-type": answer.compute,
        "x-compute-time": total_ms,
        "x-compute-characters": str(characters),
        "x-compute-tokens": str(answer.tokens),
        "x-total-time": total_ms,
        "x-tokenization-time": str(int(answer.tokenization_s * 1000)),
        "x-queue-time": str(int(answer.queue_s * 1000)),
        "x-inference-time": str(int(answer.inference_s * 1000)),
    }


@router.get(
    "/info",
    response_model=Info,
    summary="The served model and limits (TEI's Info)",
)
async def info(request: Request) -> Info:
    state = service(request)
    served, settings = live_view(state), state.settings
    summary = None
    if served.metrics:
        summary = {
            k: served.metrics.get(k)
            for k in ("validation", "test", "best_step", "world_size", "effective_batch_size", "label_names")
        }
    return Info(
        model_id=settings.model_id,
        model_sha=served.model_sha,
        model_dtype=precision.tei_name(served.precision),
        served_model_name=settings.model_name,
        model_type={
            "reranker" if len(served.labels) == 1 else "classifier": {
                "id2label": served.id2label,
                "label2id": {v: int(k) for k, v in served.id2label.items()},
            }
        },
        max_concurrent_requests=settings.max_concurrent_requests,
        max_input_length=served.max_length,
        max_batch_tokens=settings.max_batch_tokens,
        max_batch_requests=settings.max_batch_requests,
        max_client_batch_size=settings.max_client_batch_size,
        auto_truncate=settings.auto_truncate,
        tokenization_workers=1,
        version=VERSION,
        distilbert_agnews={
            "device": served.device,
            "runtime": served.runtime,
            "problem_type": served.problem_card(),
            "long_text": {
                **served.long_text,
                "long_text": CHUNK if served.chunks else TRUNCATE,
                "chunk_max_length": served.window,
                "max_chunks": settings.max_chunks,
            },
            "torch_threads": served.torch_threads,
            "agreement_with": served.agreement,
            "adapters": {name: adapter_card(one) for name, one in served.adapters.items()},
            "max_wait_ms": settings.max_wait_ms,
            "front_ends": settings.workers,
            "checkpoint": {
                "folder": served.folder,
                "weights_file": served.weights_file,
                "sha256": served.sha256,
                "loaded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(served.loaded_at)),
                "reloads": served.reloads,
                "metrics": summary,
            },
        },
    )


def adapter_card(view: ModelView) -> dict:
    """/info's account of one more adapter of the served base (LORA_ADAPTERS): what a client picking it needs."""
    return {
        "id2label": view.id2label,
        "problem_type": view.problem_card(),
        "max_input_length": view.max_length,
        "folder": view.folder,
        "weights_file": view.weights_file,
        "sha256": view.sha256,
    }


@public.get("/health", responses={503: {"model": ErrorBody}}, summary="200 while the model serves (TEI)")
@public.get("/", include_in_schema=False)
@public.get("/ping", include_in_schema=False)
async def health(request: Request) -> Response:
    live_view(service(request))
    return Response(status_code=200)


@public.get(
    "/ready", responses={503: {"model": ErrorBody}}, summary="200 once the model is loaded and warm (and watched)"
)
async def ready(request: Request) -> dict:
    state = service(request)
    live_view(state)
    if why := await state.link.why_not_ready():
        raise tei_errors.ServiceError(tei_errors.UNHEALTHY, why)
    return {"status": "ready"}


@metrics_router.get("/metrics", response_class=PlainTextResponse, summary="Prometheus metrics (TEI's names)")
async def prometheus(request: Request) -> PlainTextResponse:
    return PlainTextResponse(service(request).metrics.exposition(), media_type="text/plain; version=0.0.4")
