"""TEI's POST /rerank (router/src/http/server.rs `rerank`), and POST / and /invocations routed by model type."""

from __future__ import annotations

import time

from fastapi import Request, Response
from pydantic_core import from_json
from starlette.routing import Route

from inference import tei_errors
from inference.answers import Answer, ModelView
from inference.front_end import json_bounds, routes
from inference.front_end.link import AppState
from inference.front_end.routes import (
    ERROR_RESPONSES,
    answered,
    bearer_token,
    check_api_key,
    count_answer,
    failures_counted,
    guarded,
    live_view,
    parse,
    predict,
    queue_sequences,
    require_json,
    service,
    tei_headers,
)
from inference.front_end.schemas import Json, Rank, RerankRequest
from inference.tei_errors import ServiceError

NOT_A_RERANKER = "Backend error: model is not a re-ranker model"  # TEI: BackendError::Inference, in a Backend error


def is_reranker(view: ModelView) -> bool:
    """TEI's rule: one label makes a reranker."""
    return len(view.labels) == 1


router = guarded()


@router.post("/rerank", response_model=list[Rank], responses=ERROR_RESPONSES, summary="Rank texts by a query (TEI)")
async def rerank(request: Request) -> Json:
    state, started = service(request), time.perf_counter()
    require_json(request)
    with failures_counted(state):
        body = parse(state, await request.body(), RerankRequest)
        answer = await _scored_pairs(request, state, body)
        ranks = [
            {"index": i, **({"text": body.texts[i]} if body.return_text else {}), "score": row[0]["score"]}
            for i, row in enumerate(answer.ranked)
        ]
    count_answer(state, answer, started)
    ranks.sort(key=lambda rank: rank["score"], reverse=True)  # stable: equal scores keep the texts' order
    characters = len(body.query) * len(body.texts) + sum(len(t) for t in body.texts)
    return Json(ranks, headers=tei_headers(answer, characters, started))


async def _scored_pairs(request: Request, state: AppState, body: RerankRequest) -> Answer:
    """TEI's order: empty texts, model type, batch size."""
    if not body.texts:
        raise ServiceError(tei_errors.EMPTY, "`texts` cannot be empty", reason="validation")
    if not is_reranker(live_view(state)):
        raise ServiceError(tei_errors.BACKEND, NOT_A_RERANKER, reason="model_type")
    state.metrics.request_count.labels("batch").inc()
    pairs = [(body.query, text) for text in body.texts]
    job = queue_sequences(state, pairs, True, body.truncate, body.left, "none" if body.raw_scores else "sigmoid")
    return await answered(request, job)


async def root_fast(request: Request) -> Response:
    """POST / and /invocations: rerank for a reranker, predict for a classifier. A reranker classifies a body without
    `query` (docs/serving.md). TEI's order: the key (401), the media type (415), then the body."""
    check_api_key(request, bearer_token(request))
    require_json(request)
    state = service(request)
    if is_reranker(live_view(state)) and asks_to_rerank(state, await request.body()):
        return await rerank(request)
    return await predict(request)


def asks_to_rerank(state: AppState, raw: bytes) -> bool:
    """A JSON object with a top-level `query`; anything unreadable (not JSON, nested past the parser's depth) goes
    to predict, which answers it as TEI does. A body past the bounds is refused before it is read."""
    json_bounds.check(raw, state.settings.max_client_batch_size)
    try:
        body = from_json(raw)
    except ValueError:
        return False
    return isinstance(body, dict) and "query" in body


def fast_routes() -> list[Route]:
    return routes.fast_routes(root_fast)
