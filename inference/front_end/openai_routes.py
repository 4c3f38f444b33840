"""vLLM's classify API, which SGLang and LLM gateways speak too: POST /classify and /v1/classify, GET /v1/models.
Fields as vLLM's own (vllm/entrypoints/pooling/classify/protocol.py); answered by the same engine as /predict."""

from __future__ import annotations

import time
import uuid
from typing import Literal

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from inference import tei_errors
from inference.answers import ModelView
from inference.front_end.link import AppState
from inference.front_end.named_model import check_name, scores_in_label_order
from inference.front_end.routes import (
    ERROR_RESPONSES,
    answered,
    count_answer,
    failures_counted,
    guarded,
    live_view,
    parse,
    queue_sequences,
    require_json,
    service,
)
from inference.front_end.schemas import Json
from inference.tei_errors import ServiceError

router = guarded()
OWNER = "distilbert-agnews"


class ClassifyRequest(BaseModel):
    """vLLM's ClassificationCompletionRequest, for texts (token ids and chat messages are not taken)."""

    model_config = ConfigDict(extra="ignore", json_schema_extra={"examples": [{"input": ["Stocks fell sharply."]}]})
    model: StrictStr | None = Field(None, description="The served model's name (GET /v1/models); absent: it.")
    input: StrictStr | list[StrictStr]
    truncate_prompt_tokens: StrictInt | None = Field(
        None, ge=-1, description="-1: cut to the model's maximum; absent: as /predict (AUTO_TRUNCATE, long texts)."
    )
    truncation_side: Literal["left", "right"] | None = None
    use_activation: StrictBool | None = Field(None, description="false: the logits; else softmax or sigmoid.")
    user: StrictStr | None = None


class ClassificationData(BaseModel):
    index: int
    label: str | None
    probs: list[float]
    num_classes: int


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0
    prompt_tokens_details: None = None


class ClassificationResponse(BaseModel):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[ClassificationData]
    usage: Usage


@router.post(
    "/classify", response_model=ClassificationResponse, responses=ERROR_RESPONSES, summary="Classify (vLLM's API)"
)
@router.post("/v1/classify", include_in_schema=False)
async def classify(request: Request) -> Json:
    state, started = service(request), time.perf_counter()
    require_json(request)
    with failures_counted(state):
        body = parse(state, await request.body(), ClassifyRequest)
        name, adapter = check_name(state, body.model)
        view = live_view(state).named(adapter)
        texts = [body.input] if isinstance(body.input, str) else body.input
        if not texts:
            raise ServiceError(tei_errors.EMPTY, "`input` cannot be empty", reason="validation")
        state.metrics.request_count.labels("batch").inc()
        truncate = asked_truncation(body, view.max_length)
        scoring = "none" if body.use_activation is False else None  # None: the problem type's softmax or sigmoid
        left = body.truncation_side == "left"
        job = queue_sequences(state, [(t, None) for t in texts], True, truncate, left, scoring, adapter)
        answer = await answered(request, job)
        scores = scores_in_label_order(view, answer)
    count_answer(state, answer, started)
    data = [
        {"index": i, "label": ranked[0]["label"], "probs": row, "num_classes": len(row)}
        for i, (ranked, row) in enumerate(zip(answer.ranked, scores, strict=True))
    ]
    usage = {
        "prompt_tokens": answer.tokens,
        "total_tokens": answer.tokens,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
    }
    return Json(
        {
            "id": f"classify-{uuid.uuid4().hex}",
            "object": "list",
            "created": int(time.time()),
            "model": name,
            "data": data,
            "usage": usage,
        }
    )


def asked_truncation(body: ClassifyRequest, max_length: int) -> bool | None:
    """vLLM's truncate_prompt_tokens as /predict's truncate: -1 (or the model's maximum and above) cuts to the
    maximum; fewer tokens than the maximum is refused rather than answered from more of the text than was asked."""
    tokens = body.truncate_prompt_tokens
    if tokens is None:
        return None
    if tokens == -1 or tokens >= max_length:
        return True
    raise ServiceError(
        tei_errors.VALIDATION,
        f"truncate_prompt_tokens={tokens}: this service cuts inputs at the model's maximum ({max_length} tokens) "
        "only; send -1",
        status=400,
        reason="validation",
    )


@router.get("/v1/models", summary="The served model and its adapters (OpenAI's and vLLM's list)")
async def models(request: Request) -> dict:
    state: AppState = service(request)
    view, name = live_view(state), state.settings.model_name
    cards = [card(name, view, None)]
    cards += [card(adapter, one, name) for adapter, one in view.adapters.items()]  # vLLM: a LoRA's parent is its base
    return {"object": "list", "data": cards}


def card(name: str, view: ModelView, parent: str | None) -> dict:
    return {
        "id": name,
        "object": "model",
        "created": int(view.loaded_at),
        "owned_by": OWNER,
        "root": view.folder,
        "parent": parent,
        "max_model_len": view.max_length,
    }
