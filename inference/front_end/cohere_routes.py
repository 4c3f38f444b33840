"""Cohere's rerank API, which Jina, LiteLLM, LangChain and LlamaIndex's Cohere rerankers send too: POST /v1/rerank and
/v2/rerank, over the same engine and reranker rule as TEI's /rerank (text_routes.py)."""

from __future__ import annotations

import time
import uuid

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from inference import tei_errors
from inference.front_end import routes
from inference.front_end.named_model import check_name
from inference.front_end.schemas import Json
from inference.front_end.text_routes import NOT_A_RERANKER, is_reranker
from inference.tei_errors import ServiceError

router = routes.guarded()


class Document(BaseModel):
    model_config = ConfigDict(extra="ignore")
    text: StrictStr


class CohereRerankRequest(BaseModel):
    """Cohere's v1 and v2 rerank request (the `cohere` SDK's `rerank`); v1's documents may be {"text": ...}."""

    model_config = ConfigDict(
        extra="ignore", json_schema_extra={"examples": [{"query": "q", "documents": ["a", "b"], "top_n": 1}]}
    )
    model: StrictStr | None = Field(None, description="The served model's name (GET /v1/models); absent: it.")
    query: StrictStr
    documents: list[StrictStr | Document]
    top_n: StrictInt | None = Field(None, ge=1, description="Only the n most relevant documents.")
    return_documents: StrictBool = Field(False, description="Each result also carries its document's text.")
    max_tokens_per_doc: StrictInt | None = Field(
        None, ge=1, description="Documents are cut to the model's maximum; a lower figure is refused."
    )

    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]


class Result(BaseModel):
    index: int
    relevance_score: float
    document: Document | None = None


class CohereRerankResponse(BaseModel):
    id: str
    results: list[Result]
    meta: dict
    model: str
    usage: dict


@router.post(
    "/v2/rerank", response_model=CohereRerankResponse, responses=routes.ERROR_RESPONSES, summary="Rerank (Cohere's API)"
)
async def rerank_v2(request: Request) -> Json:
    return await rerank(request, "2")


@router.post(
    "/v1/rerank", response_model=CohereRerankResponse, responses=routes.ERROR_RESPONSES, include_in_schema=False
)
async def rerank_v1(request: Request) -> Json:
    return await rerank(request, "1")


async def rerank(request: Request, api_version: str) -> Json:
    state, started = routes.service(request), time.perf_counter()
    routes.require_json(request)
    with routes.failures_counted(state):
        body = routes.parse(state, await request.body(), CohereRerankRequest)
        name, adapter = check_name(state, body.model)
        texts = body.texts()
        if not texts:
            raise ServiceError(tei_errors.EMPTY, "`documents` cannot be empty", reason="validation")
        view = routes.live_view(state).named(adapter)
        if not is_reranker(view):
            raise ServiceError(tei_errors.BACKEND, NOT_A_RERANKER, reason="model_type")
        check_document_tokens(body, view.max_length)
        state.metrics.request_count.labels("batch").inc()
        # as Cohere does, long documents are cut (to the model's maximum), not refused
        pairs = [(body.query, text) for text in texts]
        job = routes.queue_sequences(state, pairs, True, True, False, "sigmoid", adapter)
        answer = await routes.answered(request, job)
    routes.count_answer(state, answer, started)
    order = sorted(range(len(texts)), key=lambda i: answer.ranked[i][0]["score"], reverse=True)  # stable on ties
    results = [
        {
            "index": i,
            "relevance_score": answer.ranked[i][0]["score"],
            **({"document": {"text": texts[i]}} if body.return_documents else {}),
        }
        for i in order[: body.top_n]
    ]
    meta = {"api_version": {"version": api_version}, "billed_units": {"search_units": 1}}
    usage = {"total_tokens": answer.tokens}  # Jina's
    return Json({"id": str(uuid.uuid4()), "results": results, "meta": meta, "model": name, "usage": usage})


def check_document_tokens(body: CohereRerankRequest, max_length: int) -> None:
    """max_tokens_per_doc below the model's maximum would need a cut this service does not make: refused."""
    if body.max_tokens_per_doc is not None and body.max_tokens_per_doc < max_length:
        raise ServiceError(
            tei_errors.VALIDATION,
            f"max_tokens_per_doc={body.max_tokens_per_doc}: this service cuts each query and document pair at the "
            f"model's maximum ({max_length} tokens) only; leave it out or send at least {max_length}",
            status=400,
            reason="validation",
        )
