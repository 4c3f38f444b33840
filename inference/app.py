"""FastAPI service: POST /predict, GET /health /ready /info /metrics, /docs.

    uvicorn inference.app:app            # settings from environment variables (inference/settings.py)
    python -m inference --checkpoint_dir checkpoints --port 8000

The model is loaded once in the lifespan, served by the micro-batching engine (inference/engine.py), and
replaced without downtime when training writes a new checkpoint (inference/reload.py).
"""

from __future__ import annotations

import hmac
import logging
import time
from contextlib import asynccontextmanager
from typing import Any, Optional

import torch
from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from inference.engine import Engine, Overloaded, TooLong, warm_up
from inference.loading import LoadedModel, load_configured
from inference.metrics import Metrics
from inference.reload import CheckpointWatcher
from inference.schemas import ErrorBody, PredictRequest, PredictResponse
from inference.settings import Settings

logger = logging.getLogger("inference")


class ServiceError(Exception):
    """An error answered as {"error", "error_type"} with an HTTP status."""

    def __init__(self, status: int, error_type: str, message: str):
        super().__init__(message)
        self.status, self.error_type, self.message = status, error_type, message


def error_response(status: int, error_type: str, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "error_type": error_type}, status_code=status)


class BodySizeLimit:
    """ASGI middleware: 413 for bodies over the limit, by Content-Length or while streaming."""

    class TooLarge(Exception):
        pass

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        too_large = error_response(413, "payload_too_large", f"request body is larger than {self.max_bytes} bytes")
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


def ready_engine(settings: Settings, loaded: LoadedModel, metrics: Metrics) -> Engine:
    """Torch threads set, the model warmed up, and an Engine over it (not running yet)."""
    torch.set_num_threads(settings.torch_threads)
    warm_up(loaded)
    return Engine(loaded, max_batch_size=settings.max_batch_size, max_wait_ms=settings.max_wait_ms,
                  max_queue_size=settings.max_queue_size, metrics=metrics)


def create_app(settings: Optional[Settings] = None, engine: Optional[Engine] = None) -> FastAPI:
    """The service. `engine`: one made by ready_engine whose `run()` the caller drives on a thread of its
    own (python -m inference: the main thread); without one the lifespan loads the model and starts an
    Engine on a worker thread."""
    settings = settings or Settings.from_env()
    metrics = engine.metrics if engine else Metrics()
    state: dict[str, Any] = {"engine": None, "ready": False, "reloads": 0}

    def load() -> LoadedModel:
        return load_configured(settings.checkpoint_dir, settings.device, settings.precision)

    def swap_in(loaded: LoadedModel) -> None:
        warm_up(loaded)
        state["engine"].swap(loaded)
        state["reloads"] += 1
        metrics.reloads.inc("ok")
        logger.info("Now serving %s (sha256 %s)", loaded.weights_file, loaded.sha256[:12])

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        serving = engine
        if serving is None:
            loaded = await run_in_threadpool(load)
            serving = await run_in_threadpool(ready_engine, settings, loaded, metrics)
            serving.start()
        loaded = serving.current
        state["engine"] = serving
        watcher = None
        if settings.reload_interval_s > 0:
            watcher = CheckpointWatcher(settings.checkpoint_dir, settings.reload_interval_s, loaded.signature,
                                        load=load, on_loaded=swap_in,
                                        on_failed=lambda: metrics.reloads.inc("failed"))
            watcher.start()
        state["ready"] = True
        logger.info("Ready: %s on %s (%s), labels %s", loaded.weights_file, loaded.device, loaded.precision,
                    ", ".join(loaded.labels))
        yield
        state["ready"] = False
        if watcher:
            watcher.stop()
        await run_in_threadpool(serving.stop)  # answers every queued request before the process exits

    app = FastAPI(title="distilbert-agnews", version="0.1.0", lifespan=lifespan,
                  description="Text classification (AG News topics by default); /predict is compatible with "
                              "text-embeddings-inference.",
                  responses={422: {"model": ErrorBody}, 429: {"model": ErrorBody}, 503: {"model": ErrorBody}})
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)

    @app.exception_handler(ServiceError)
    async def service_error(_: Request, exc: ServiceError):
        return error_response(exc.status, exc.error_type, exc.message)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "body"
        return error_response(422, "validation", f"{where}: {first.get('msg')}")

    @app.exception_handler(Exception)
    async def internal_error(_: Request, exc: Exception):
        # Starlette logs the traceback; the client still gets the documented error body.
        return error_response(500, "internal", f"internal error ({type(exc).__name__})")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException):
        kinds = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized"}
        return error_response(exc.status_code, kinds.get(exc.status_code, "http"), str(exc.detail))

    def live_engine() -> Engine:
        if not state["ready"]:
            raise ServiceError(503, "unhealthy", "the model is not loaded yet")
        return state["engine"]

    def require_api_key(request: Request) -> None:
        if not settings.api_key:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), settings.api_key.encode()):
            raise ServiceError(401, "unauthorized", "missing or wrong API key (Authorization: Bearer <key>)")

    @app.post("/predict", response_model=PredictResponse, dependencies=[Depends(require_api_key)],
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": PredictRequest.model_json_schema()}}}})
    async def predict(request: Request):
        started = time.perf_counter()
        status = 200
        try:
            return await classify(await parse_body(request))
        except ServiceError as exc:
            status = exc.status
            raise
        except Exception:
            status = 500  # answered by internal_error below; counted as what the client sees
            raise
        finally:
            metrics.requests.inc(str(status))
            metrics.latency.observe(time.perf_counter() - started)

    async def parse_body(request: Request) -> PredictRequest:
        """JSON whatever the Content-Type says (curl -d sends a form type), validated by PredictRequest."""
        raw = await request.body()
        try:
            return PredictRequest.model_validate_json(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "body"
            raise ServiceError(422, "validation", f"{where}: {first.get('msg')}") from None

    async def classify(body: PredictRequest):
        single = isinstance(body.inputs, str)
        texts = [body.inputs] if single else [t[0] if isinstance(t, list) and len(t) == 1 else t for t in body.inputs]
        if any(isinstance(t, list) for t in texts):
            raise ServiceError(422, "validation", "inputs: each inner list must hold exactly one text (pairs are not supported)")
        if not texts:
            raise ServiceError(422, "validation", "inputs: send at least one text")
        if len(texts) > settings.max_client_batch_size:
            raise ServiceError(422, "validation", f"inputs: {len(texts)} texts, more than max_client_batch_size "
                                                  f"({settings.max_client_batch_size})")
        empty = next((i for i, t in enumerate(texts) if not t.strip()), None)
        if empty is not None:
            raise ServiceError(400, "empty", f"inputs[{empty}] is empty" if not single else "inputs is empty")
        current = live_engine()
        labels = current.current.labels
        if body.top_k is not None and body.top_k > len(labels):
            raise ServiceError(422, "validation", f"top_k: must be between 1 and {len(labels)}")
        try:
            logits = await current.predict(texts, body.truncate)
        except Overloaded as exc:
            raise ServiceError(429, "overloaded", str(exc)) from None
        except TooLong as exc:
            raise ServiceError(422, "validation", str(exc)) from None
        answers = [rank(row, labels, body.top_k, body.raw_scores) for row in logits]
        return answers[0] if single else answers

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/ready", responses={503: {"model": ErrorBody}})
    async def ready():
        live_engine()
        return {"status": "ready"}

    @app.get("/info", dependencies=[Depends(require_api_key)])
    async def info():
        loaded = live_engine().current
        summary = None
        if loaded.metrics:
            summary = {k: loaded.metrics.get(k) for k in ("validation", "test", "best_step", "world_size",
                                                           "effective_batch_size", "label_names")}
        return {
            "model_type": loaded.model.config.model_type,
            "labels": loaded.labels,
            "max_input_length": loaded.max_length,
            "max_client_batch_size": settings.max_client_batch_size,
            "max_batch_size": settings.max_batch_size,
            "max_wait_ms": settings.max_wait_ms,
            "precision": loaded.precision,
            "device": str(loaded.device),
            "torch_threads": torch.get_num_threads(),
            "checkpoint": {"weights_file": loaded.weights_file, "sha256": loaded.sha256,
                           "loaded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(loaded.loaded_at)),
                           "reloads": state["reloads"], "metrics": summary},
        }

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus():
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    return app


def rank(logits: list[float], labels: list[str], top_k: Optional[int], raw: bool) -> list[dict]:
    scores = logits if raw else torch.softmax(torch.tensor(logits), dim=-1).tolist()
    ranked = sorted(({"label": label, "score": s} for label, s in zip(labels, scores)), key=lambda p: -p["score"])
    return ranked[:top_k] if top_k else ranked


app = create_app()
