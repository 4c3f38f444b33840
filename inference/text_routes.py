"""TEI's routes beyond /predict: POST /rerank, /tokenize and /decode, as router/src/http/server.rs of
huggingface/text-embeddings-inference answers them (`rerank`, `tokenize`, `decode`) with the bodies of
router/src/http/types.rs (`RerankRequest`, `Rank`, `TokenizeRequest`, `SimpleToken`, `DecodeRequest`).

/rerank scores each (query, text) pair with a model of one output (TEI's "reranker": a cross-encoder, a regression
pair model), through the same micro-batches, limits and long-text handling as /predict; a model with several
outputs gets TEI's error. /tokenize and /decode use the served model's tokenizer.
"""

from __future__ import annotations

import asyncio
import time

from fastapi import Request, Response
from fastapi.responses import JSONResponse
from starlette.routing import Route

from inference import errors, routes
from inference.engine import Answer
from inference.errors import ServiceError
from inference.routes import (
    ERROR_RESPONSES,
    answered,
    bearer_token,
    check_api_key,
    check_batch_size,
    observe,
    parse,
    predict_fast,
    queue_sequences,
    require_json,
    router,
    service,
    tei_headers,
)
from inference.schemas import DecodeRequest, Rank, RerankRequest, SimpleToken, TokenizeRequest
from inference.service import Service

NOT_A_RERANKER = "Backend error: model is not a re-ranker model"  # TEI: BackendError::Inference, in a Backend error


def is_reranker(state: Service) -> bool:
    """TEI's rule (router/src/lib.rs): a classifier whose id2label has one entry is a re-ranker."""
    return len(state.live_engine().current.labels) == 1


@router.post("/rerank", response_model=list[Rank], responses=ERROR_RESPONSES, summary="Rank texts by a query (TEI)")
async def rerank(request: Request) -> JSONResponse:
    state, started = service(request), time.perf_counter()
    require_json(request)
    try:
        body = parse(await request.body(), RerankRequest)
        answer = await _scored_pairs(request, state, body)
        ranks = [
            {"index": i, **({"text": body.texts[i]} if body.return_text else {}), "score": row[0]["score"]}
            for i, row in enumerate(answer.ranked)
        ]
        if any(rank["score"] != rank["score"] for rank in ranks):  # NaN: TEI refuses to rank it (server.rs)
            raise ServiceError(errors.BACKEND, "score is NaN")
    except ServiceError as exc:
        state.metrics.request_failure.labels(exc.reason).inc()
        raise
    state.metrics.request_success.labels("batch").inc()
    state.metrics.predict_success.inc(len(answer.ranked))
    observe(state, answer, time.perf_counter() - started)
    ranks.sort(key=lambda rank: rank["score"], reverse=True)  # stable: equal scores keep the texts' order
    characters = len(body.query) * len(body.texts) + sum(len(t) for t in body.texts)
    return JSONResponse(ranks, headers=tei_headers(answer, characters, started))


async def _scored_pairs(request: Request, state: Service, body: RerankRequest) -> Answer:
    """TEI's order of checks: empty texts, the model type, then (counted as a batch request) the batch size."""
    if not body.texts:
        raise ServiceError(errors.EMPTY, "`texts` cannot be empty", reason="validation")
    if not is_reranker(state):
        raise ServiceError(errors.BACKEND, NOT_A_RERANKER, reason="model_type")
    state.metrics.request_count.labels("batch").inc()
    pairs = [(body.query, text) for text in body.texts]
    job = queue_sequences(state, pairs, True, body.truncate, body.left, "none" if body.raw_scores else "sigmoid")
    return await answered(request, job)


async def root_fast(request: Request) -> Response:
    """POST / and /invocations: TEI routes them to `rerank` for a re-ranker and to `predict` for a classifier
    (router/src/http/server.rs, by the model type). For a re-ranker, a body without `query` (a /predict body, what
    InferenceClient.text_classification sends to the base URL) is classified instead of refused: a deliberate
    difference (docs/serving.md)."""
    if is_reranker(service(request)) and b'"query"' in await request.body():
        check_api_key(request, bearer_token(request))
        return await rerank(request)
    return await predict_fast(request)


def fast_routes() -> list[Route]:
    return routes.fast_routes(root_fast)


@router.post("/tokenize", response_model=list[list[SimpleToken]], responses=ERROR_RESPONSES, summary="Tokens (TEI)")
async def tokenize(request: Request) -> JSONResponse:
    state = service(request)
    require_json(request)
    body = parse(await request.body(), TokenizeRequest)
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    _check_batch(state, texts, "inputs", batch=not isinstance(body.inputs, str))
    if body.prompt_name is not None:  # TEI (core/src/tokenization.rs prepare_pre_prompt), for a model without them
        raise ServiceError(
            errors.VALIDATION,
            f"Input validation error: `default-prompt-name` is set to `{body.prompt_name}` but no prompts were "
            "found in the Sentence Transformers configuration",
        )
    engine = state.live_engine()
    return JSONResponse(await asyncio.to_thread(_tokens, engine, texts, body.add_special_tokens))


def _tokens(engine, texts: list[str], add_special_tokens: bool) -> list[list[dict]]:
    """TEI's into_tokens: each token's id, text (the input's own characters; a special token's own string), whether
    it is special, and its byte offsets (None for special tokens)."""
    with engine.tokenizer() as tokenizer:
        encoded = tokenizer(
            texts,
            add_special_tokens=add_special_tokens,
            return_offsets_mapping=True,
            return_special_tokens_mask=True,
            truncation=False,
            verbose=False,
        )
        names = [tokenizer.convert_ids_to_tokens(ids) for ids in encoded["input_ids"]]
    answer = []
    for text, ids, offsets, special, tokens in zip(
        texts, encoded["input_ids"], encoded["offset_mapping"], encoded["special_tokens_mask"], names
    ):
        row = []
        for token_id, (start, stop), is_special, name in zip(ids, offsets, special, tokens):
            if is_special:
                row.append({"id": token_id, "text": name, "special": True, "start": None, "stop": None})
            else:
                first, last = len(text[:start].encode()), len(text[:stop].encode())
                row.append({"id": token_id, "text": text[start:stop], "special": False, "start": first, "stop": last})
        answer.append(row)
    return answer


@router.post("/decode", response_model=list[str], responses=ERROR_RESPONSES, summary="Text from token ids (TEI)")
async def decode(request: Request) -> JSONResponse:
    state = service(request)
    require_json(request)
    body = parse(await request.body(), DecodeRequest)
    batch = bool(body.ids) and isinstance(body.ids[0], list)
    sequences = body.ids if batch else [body.ids]
    _check_batch(state, sequences, "ids", batch=batch)
    engine = state.live_engine()
    return JSONResponse(await asyncio.to_thread(_decoded, engine, sequences, body.skip_special_tokens))


def _decoded(engine, sequences: list[list[int]], skip_special_tokens: bool) -> list[str]:
    with engine.tokenizer() as tokenizer:
        size = len(tokenizer)
        for ids in sequences:
            unknown = [i for i in ids if i >= size]
            if unknown:  # TEI: the tokenizer's own error, as a Tokenizer error (422)
                raise ServiceError(errors.TOKENIZER, f"tokenizer error id {unknown[0]} is out of the vocabulary")
        return [tokenizer.decode(ids, skip_special_tokens=skip_special_tokens) for ids in sequences]


def _check_batch(state: Service, items: list, field: str, batch: bool) -> None:
    """TEI's checks of a batch: not empty, at most MAX_CLIENT_BATCH_SIZE (each counted as a failed request)."""
    if not batch:
        return
    try:
        if not items:
            raise ServiceError(errors.EMPTY, f"`{field}` cannot be empty", reason="validation")
        check_batch_size(state.settings, len(items))
    except ServiceError as exc:
        state.metrics.request_failure.labels(exc.reason).inc()
        raise
