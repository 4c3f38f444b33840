"""The FastAPI service: text-embeddings-inference's classifier API (POST /predict, GET /info, /health, /metrics).

    uvicorn inference.app:app            # settings from environment variables (inference/settings.py)
    python -m inference --model_id checkpoints --port 8000

Pieces: settings.py (configuration), service.py (state and lifespan: load once, reload, drain), routes.py,
errors.py (TEI's error bodies), middleware.py (status count, request id, body limit), engine.py (micro-batching),
loading.py (folders and Hub ids), metrics.py (Prometheus).
"""

from __future__ import annotations

import sys

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from inference import errors, routes
from inference.engine import Engine
from inference.middleware import BodySizeLimit, RequestId, ResponseStatus
from inference.service import Service, lifespan
from inference.settings import Settings, SettingsError, from_env

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
    """The service. `engine`: one made by service.ready_engine whose `run()` the caller drives on a thread of its
    own (python -m inference: the main thread); without one the lifespan loads the model and starts an Engine
    on a worker thread."""
    settings = settings or from_env()
    app = FastAPI(
        title="distilbert-agnews",
        version=routes.VERSION,
        lifespan=lifespan,
        description="Text classification (AG News topics by default) with the API of Hugging Face "
        "text-embeddings-inference: POST /predict, GET /info, /health, /metrics.",
    )
    app.state.service = Service(settings, engine)
    app.include_router(routes.router)
    app.include_router(routes.public)
    errors.install(app)
    # added last = outermost: the status count, the request id, CORS answers preflights, then the body limit
    app.add_middleware(BodySizeLimit, max_bytes=settings.payload_limit)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["content-type", "authorization", "x-request-id"],
            expose_headers=TEI_HEADERS,
        )
    app.add_middleware(RequestId)
    app.add_middleware(ResponseStatus)
    return app


def _app_from_env() -> FastAPI:
    """`uvicorn inference.app:app`: a bad setting is one line on stderr and exit code 2, not a traceback."""
    try:
        return create_app()
    except SettingsError as exc:
        sys.stderr.write(f"inference: error: {exc}\n")
        raise SystemExit(2) from None


app = _app_from_env()
