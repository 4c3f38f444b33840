"""The served model as the clients that name one see it (vLLM's classify, Cohere's rerank, KServe v2): the name they
must send, the 404 for any other, and each input's scores in label order. Called by their routes."""

from __future__ import annotations

from typing import TypeVar

from fastapi import Request
from pydantic import BaseModel

from inference import tei_errors
from inference.answers import Answer, ModelView
from inference.front_end.link import AppState
from inference.front_end.routes import live_view, parse
from inference.tei_errors import ServiceError

M = TypeVar("M", bound=BaseModel)

NOT_FOUND = "NotFound"


def check_name(state: AppState, requested: str | None, openai_body: bool = True) -> tuple[str, str | None]:
    """(the name answered, the adapter to queue for: None for the served model itself) when `requested` is the served
    model's name, one of its adapters' (LORA_ADAPTERS) or absent; else 404, in vLLM's error body (ErrorResponse in
    vllm/entrypoints/openai/protocol.py) or, for KServe, TEI's (its "error" string is the Open Inference Protocol's)."""
    name, adapters = state.settings.model_name, state.settings.adapters()
    if requested is None or requested == name:
        return name, None
    if requested in adapters:
        return requested, requested
    served = ", ".join(f"`{one}`" for one in (name, *adapters))
    message = f"The model `{requested}` does not exist. This service serves {served} (GET /v1/models)."
    body = {"error": {"message": message, "type": "NotFoundError", "param": "model", "code": 404}}
    raise ServiceError(NOT_FOUND, message, status=404, reason="model", body=body if openai_body else None)


async def named_request(request: Request, state: AppState, schema: type[M]) -> tuple[M, str, str | None, ModelView]:
    """A request whose `model` names what answers it: its body parsed, the name answered, the adapter to queue for
    (check_name) and that model's view."""
    body = parse(state, await request.body(), schema)
    name, adapter = check_name(state, body.model)
    return body, name, adapter, live_view(state).named(adapter)


def scores_in_label_order(view: ModelView, answer: Answer) -> list[list[float]]:
    """Each input's scores in `view`'s label order (the answer's are its model's: a reload may have reordered them)."""
    if answer.labels == view.labels:
        return answer.scores
    if set(answer.labels) != set(view.labels):  # a reload renamed the labels
        raise ServiceError(tei_errors.UNHEALTHY, "the model changed while answering; send the request again")
    order = [answer.labels.index(label) for label in view.labels]
    return [[row[i] for i in order] for row in answer.scores]
