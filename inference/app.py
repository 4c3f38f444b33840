"""The FastAPI app: TEI's classifier and reranker API, with middleware and the lifespan (service.py)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.middleware.cors import CORSMiddleware

from inference import tei_errors
from inference.front_end import (
    cohere_routes,
    connections,
    kserve_routes,
    moderation_routes,
    openai_routes,
    routes,
    text_routes,
    token_routes,
    tracing,
)
from inference.front_end.link import ENGINE_ENV, AppState, RemoteLink, front_end_lifespan
from inference.front_end.middleware import BodySizeLimit, RequestId, ResponseStatus
from inference.front_end.tracing import Traces
from inference.prometheus import Metrics
from inference.settings import Settings, SettingsError, from_env

if TYPE_CHECKING:
    from inference.engine.scheduler import Engine

TEI_HEADERS = [
    "x-compute-type",
    "x-compute-time",
    "x-compute-characters",
    "x-compute-tokens",
    "x-total-time",
    "x-tokenization-time",
    "x-queue-time",
    "x-inference-time",
    "x-request-id",
]


def create_app(settings: Settings | None = None, engine: Engine | None = None) -> FastAPI:
    """The service; with `engine`, the caller drives its worker, else the lifespan starts one. A front-end of
    `python -m inference` with WORKERS > 1 (ENGINE_ENV set) links to the engine's process instead: no torch here."""
    settings = settings or from_env()
    connections.configure(settings.read_timeout_s, settings.write_timeout_s)
    address = os.environ.get(ENGINE_ENV)
    if address and engine is None:
        state, lifespan = AppState(settings, Metrics(), RemoteLink(address)), front_end_lifespan
    else:
        from inference.engine.service import Service, lifespan  # the engine in this process: torch loads here

        state = Service(settings, engine)
    app = FastAPI(
        title="distilbert-agnews",
        version=routes.VERSION,
        lifespan=lifespan,
        description="Text classification (AG News topics by default) with the API of Hugging Face "
        "text-embeddings-inference: POST /predict, GET /info, /health, /metrics; and the shapes of vLLM's classify, "
        "Cohere's rerank and KServe v2.",
    )
    app.state.service = state
    app.router.routes[0:0] = text_routes.fast_routes()  # matched first: the hot path without FastAPI's machinery
    for tei in (routes.router, text_routes.router, token_routes.router, routes.public):
        app.include_router(tei)  # TEI's: /info, /health, /ready, /rerank, /tokenize, /decode
    families = (openai_routes.router, moderation_routes.router, cohere_routes.router, kserve_routes.router)
    for family in (*families, kserve_routes.public):
        app.include_router(family)  # the other clients': vLLM, OpenAI's moderation, Cohere's rerank, KServe v2
    if settings.api_metrics:
        app.include_router(routes.metrics_router)
    app.openapi = schema_of(app)
    tei_errors.install(app)
    # last added runs first: status count, request id, CORS, body limit
    app.add_middleware(BodySizeLimit, max_bytes=settings.payload_limit)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["content-type", "authorization", "x-request-id"],
            expose_headers=TEI_HEADERS,
        )
    app.state.tracing = tracing.Tracing(settings) if settings.otlp_endpoint else None
    if app.state.tracing:  # no cost per request when tracing is off
        app.add_middleware(Traces, tracer=app.state.tracing.tracer)
    app.add_middleware(RequestId)
    app.add_middleware(ResponseStatus)
    return app


def schema_of(app: FastAPI):
    """/openapi.json: the app's FastAPI routes and POST /predict, which a Starlette route serves."""

    def schema() -> dict:
        if app.openapi_schema is None:
            described = [*routes.described.routes, *app.routes]
            app.openapi_schema = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=described
            )
        return app.openapi_schema

    return schema


def app_from_env() -> FastAPI:
    """The app configured by the environment (uvicorn's factory, each worker): a bad setting exits 2 in one line."""
    try:
        app = create_app()
    except SettingsError as exc:
        sys.stderr.write(f"inference: error: {exc}\n")
        raise SystemExit(2) from None
    app.state.service.owns_process = True  # in a front-end: unused
    return app


def __getattr__(name: str) -> FastAPI:
    """`uvicorn inference.app:app`: built on first lookup, not at import."""
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()["app"] = built = app_from_env()
    return built
