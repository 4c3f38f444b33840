"""vLLM's classify and score API, which SGLang and LLM gateways speak too: POST /classify and /v1/classify, POST /score
and /v1/score (a one-output pair model), GET /v1/models. Fields as vLLM's own (vllm/entrypoints/pooling/classify/
protocol.py, vllm/entrypoints/pooling/scoring/protocol.py); answered by the same engine as /predict and /rerank."""

from __future__ import annotations

import time
import uuid
from typing import Literal

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from contract.scoring import BEST, REVIEW
from inference import tei_errors
from inference.answers import ModelView
from inference.front_end import chat
from inference.front_end.chat import ChatFields
from inference.front_end.link import AppState
from inference.front_end.named_model import NOT_FOUND, named_request, scores_in_label_order
from inference.front_end.routes import (
    ERROR_RESPONSES,
    answered,
    count_answer,
    failures_counted,
    guarded,
    live_view,
    queue_sequences,
    require_json,
    service,
)
from inference.front_end.schemas import Json
from inference.front_end.text_routes import is_reranker
from inference.tei_errors import ServiceError

router = guarded()
OWNER = "distilbert-agnews"


class ClassifyRequest(ChatFields):
    """vLLM's ClassificationCompletionRequest (`input`, texts) or ClassificationChatRequest (`messages`); token ids
    are not taken."""

    model_config = ConfigDict(extra="ignore", json_schema_extra={"examples": [{"input": ["Stocks fell sharply."]}]})
    model: StrictStr | None = Field(None, description="The served model's name (GET /v1/models); absent: it.")
    input: StrictStr | list[StrictStr] | None = None
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
        body, name, adapter, view = await named_request(request, state, ClassifyRequest)
        texts = await classified_texts(state, view, adapter, body)
        special = body.add_special_tokens if body.add_special_tokens is not None else body.messages is None
        if not texts:
            raise ServiceError(tei_errors.EMPTY, "`input` cannot be empty", reason="validation")
        state.metrics.request_count.labels("batch").inc()
        truncate = asked_truncation(body, view.max_length)
        scoring = "none" if body.use_activation is False else None  # None: the problem type's softmax or sigmoid
        left = body.truncation_side == "left"
        job = queue_sequences(state, [(t, None) for t in texts], True, truncate, left, scoring, adapter, special)
        answer = await answered(request, job)
        scores = scores_in_label_order(view, answer)
    count_answer(state, answer, started)
    labels = decided_labels(view, scores, [ranked[0]["label"] for ranked in answer.ranked], scoring is None)
    data = [
        {"index": i, "label": label, "probs": row, "num_classes": len(row)}
        for i, (label, row) in enumerate(zip(labels, scores, strict=True))
    ]
    return listed("classify", name, data, answer.tokens)


async def classified_texts(state: AppState, view: ModelView, adapter: str | None, body: ClassifyRequest) -> list:
    """The texts of `input`, or the one chat of `messages` rendered by the model's chat template."""
    if (body.input is None) == (body.messages is None):
        raise vllm_error("send `input` (texts) or `messages` (a chat), one of them")
    if body.messages is None:
        return [body.input] if isinstance(body.input, str) else body.input
    _, tokenizing = await state.encoders.for_version(view, adapter)
    try:
        return [chat.rendered(tokenizing.tokenizer, body)]
    except chat.ChatRefused as exc:
        raise vllm_error(str(exc)) from None


def decided_labels(view: ModelView, scores: list[list[float]], top: list[str], probabilities: bool) -> list[str]:
    """vLLM's `label`: the top label, as vLLM names it; for a single-label model scored as probabilities, the
    decision: `review` where the review band withholds it."""
    if view.decides != BEST or not probabilities or not view.review_band:
        return top
    withheld = view.decisions(scores).withheld().tolist()
    return [REVIEW if out else label for label, out in zip(top, withheld, strict=True)]


def listed(kind: str, name: str, data: list[dict], tokens: int) -> Json:
    """vLLM's list answer: its data, and UsageInfo (vllm/entrypoints/openai/engine/protocol.py)."""
    usage = {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0, "prompt_tokens_details": None}
    created = int(time.time())
    return Json(
        {
            "id": f"{kind}-{uuid.uuid4().hex}",
            "object": "list",
            "created": created,
            "model": name,
            "data": data,
            "usage": usage,
        }  # fmt: skip
    )


Texts = StrictStr | list[StrictStr]
PAIR_NAMES = (("text_1", "text_2"), ("data_1", "data_2"), ("queries", "documents"), ("queries", "items"))


class ScoreRequest(BaseModel):
    """vLLM's score request, for texts: the two sides under any of its names (text_1 and text_2, data_1 and data_2,
    queries and documents or items), one text against many or as many against as many."""

    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={"examples": [{"text_1": "who won?", "text_2": ["Shares fell", "The Yankees won"]}]},
    )
    model: StrictStr | None = Field(None, description="The served model's name (GET /v1/models); absent: it.")
    text_1: Texts | None = None
    text_2: Texts | None = None
    data_1: Texts | None = None
    data_2: Texts | None = None
    queries: Texts | None = None
    documents: Texts | None = None
    items: Texts | None = None
    truncate_prompt_tokens: StrictInt | None = Field(
        None, ge=-1, description="-1: cut to the model's maximum; absent: as /rerank (AUTO_TRUNCATE)."
    )
    use_activation: StrictBool | None = Field(None, description="false: the logit; else its sigmoid, as /rerank.")
    user: StrictStr | None = None

    def pairs(self) -> list[tuple[str, str]]:
        """(first, second) per score, as vLLM pairs them: 1:1, 1:N or N:N."""
        named = [(getattr(self, a), getattr(self, b)) for a, b in PAIR_NAMES]
        sides = next((pair for pair in named if None not in pair), None)
        if sides is None:
            raise vllm_error("send text_1 and text_2 (or data_1 and data_2, queries and documents or items)")
        first, second = ([side] if isinstance(side, str) else side for side in sides)
        if len(first) > 1 and len(first) != len(second):  # vLLM's words (scoring/utils.py)
            raise vllm_error("Input lengths must be either 1:1, 1:N or N:N")
        if not first or not second:
            raise vllm_error(f"At least one {'text' if not first else 'text_pair'} element must be given")
        return list(zip(first * len(second) if len(first) == 1 else first, second, strict=True))


class ScoreData(BaseModel):
    index: int
    object: str = "score"
    score: float


class ScoreResponse(BaseModel):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[ScoreData]
    usage: Usage


@router.post("/score", response_model=ScoreResponse, responses=ERROR_RESPONSES, summary="Score pairs (vLLM's API)")
@router.post("/v1/score", include_in_schema=False)
async def score(request: Request) -> Json:
    state, started = service(request), time.perf_counter()
    require_json(request)
    with failures_counted(state):
        body, name, adapter, view = await named_request(request, state, ScoreRequest)
        if not is_reranker(view):  # vLLM serves /score for one-output models only: the route is not there
            raise ServiceError(NOT_FOUND, "/score needs a one-output model", status=404, body={"detail": "Not Found"})
        pairs = body.pairs()
        state.metrics.request_count.labels("batch").inc()
        scoring = "none" if body.use_activation is False else "sigmoid"
        job = queue_sequences(state, pairs, True, asked_truncation(body, view.max_length), False, scoring, adapter)
        answer = await answered(request, job)
    count_answer(state, answer, started)
    data = [{"index": i, "object": "score", "score": ranked[0]["score"]} for i, ranked in enumerate(answer.ranked)]
    return listed("score", name, data, answer.tokens)


def vllm_error(message: str) -> ServiceError:
    """A refused request in vLLM's ErrorResponse (vllm/entrypoints/openai/engine/protocol.py)."""
    body = {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}
    return ServiceError(tei_errors.VALIDATION, message, status=400, reason="validation", body=body)


def asked_truncation(body: ClassifyRequest | ScoreRequest, max_length: int) -> bool | None:
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
        "problem_type": view.problem_card(),  # ours: how it decides (thresholds, review band)
    }
