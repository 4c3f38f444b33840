"""The served model as the clients that name one see it (vLLM's classify, Cohere's rerank, KServe v2): the name they
must send, the 404 for any other, and each input's scores in label order. Called by their routes."""

from __future__ import annotations

from inference import errors
from inference.answers import Answer, ModelView
from inference.errors import ServiceError
from inference.front_end.link import AppState

NOT_FOUND = "NotFound"


def check_name(state: AppState, requested: str | None, openai_body: bool = True) -> str:
    """The served model's name when `requested` is it or absent; else 404, in vLLM's error body (ErrorResponse in
    vllm/entrypoints/openai/protocol.py) or, for KServe, TEI's (its "error" string is the Open Inference Protocol's)."""
    name = state.settings.model_name
    if requested is None or requested == name:
        return name
    message = f"The model `{requested}` does not exist. This service serves `{name}` (GET /v1/models)."
    body = {"error": {"message": message, "type": "NotFoundError", "param": "model", "code": 404}}
    raise ServiceError(NOT_FOUND, message, status=404, reason="model", body=body if openai_body else None)


def scores_in_label_order(view: ModelView, answer: Answer) -> list[list[float]]:
    """Each input's scores in the model's label order (the engine answers them best first)."""
    rows = []
    for ranked in answer.ranked:
        scores = {entry["label"]: entry["score"] for entry in ranked}
        if answer.version != view.version and set(scores) != set(view.labels):  # a reload renamed the labels
            raise ServiceError(errors.UNHEALTHY, "the model changed while answering; send the request again")
        rows.append([scores[label] for label in view.labels])
    return rows
