"""OpenAI's moderation API, which guardrail gateways (LiteLLM and the like) call: POST /v1/moderations, answered by
any classifier. Each label is a category: decided as the checkpoint decides (contract/scoring.py `decide`, its review
band withholding a decision: `review` lists those labels), scored as /predict scores it; an input is flagged where a
label of FLAG_LABELS is decided yes. Fields as the `openai` SDK's own
(openai/types/moderation_create_response.py, openai/types/moderation.py)."""

from __future__ import annotations

import time
import uuid

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from contract.scoring import BEST, THRESHOLDS
from inference import tei_errors
from inference.answers import ModelView
from inference.front_end import routes
from inference.front_end.named_model import named_request, scores_in_label_order
from inference.front_end.schemas import Json
from inference.tei_errors import ServiceError

router = routes.guarded()


class ModerationRequest(BaseModel):
    """OpenAI's moderation request (ModerationCreateParams), for texts."""

    model_config = ConfigDict(extra="ignore", json_schema_extra={"examples": [{"input": ["You are wonderful"]}]})
    model: StrictStr | None = Field(None, description="The served model's name (GET /v1/models); absent: it.")
    input: StrictStr | list[StrictStr]


class Moderation(BaseModel):
    flagged: bool
    categories: dict[str, bool]
    category_scores: dict[str, float]
    category_applied_input_types: dict[str, list[str]]
    review: list[str] = Field(description="Ours: the labels whose decision the review band withholds.")


class ModerationResponse(BaseModel):
    id: str
    model: str
    results: list[Moderation]


@router.post(
    "/v1/moderations",
    response_model=ModerationResponse,
    responses=routes.ERROR_RESPONSES,
    summary="Moderate (OpenAI's API): each label a category",
)
async def moderations(request: Request) -> Json:
    state, started = routes.service(request), time.perf_counter()
    routes.require_json(request)
    with routes.failures_counted(state):
        body, name, adapter, view = await named_request(request, state, ModerationRequest)
        flagging = flag_labels(view, state.settings.flag_labels, state.settings.negative_label)
        texts = [body.input] if isinstance(body.input, str) else body.input
        if not texts:
            raise ServiceError(tei_errors.EMPTY, "`input` cannot be empty", reason="validation")
        state.metrics.request_count.labels("batch").inc()
        job = routes.queue_sequences(state, [(t, None) for t in texts], True, None, False, None, adapter)
        answer = await routes.answered(request, job)
        scores = scores_in_label_order(view, answer)
    routes.count_answer(state, answer, started)
    decisions = view.decisions(scores)
    results = [
        moderation(view, *each, flagging) for each in zip(scores, decisions.chosen, decisions.review, strict=True)
    ]
    return Json({"id": f"modr-{uuid.uuid4().hex}", "model": name, "results": results})


def moderation(view: ModelView, row: list[float], chosen, review, flagging: set[str]) -> dict:
    """One input's result: each label's decision and score, flagged where a flagging label is decided yes."""
    categories = dict(zip(view.labels, chosen.tolist(), strict=True))
    return {
        "flagged": any(categories[label] for label in flagging),
        "categories": categories,
        "category_scores": dict(zip(view.labels, row, strict=True)),
        "category_applied_input_types": {label: ["text"] for label in view.labels},
        "review": [label for label, out in zip(view.labels, review.tolist(), strict=True) if out],
    }


def flag_labels(view: ModelView, named: list[str], negative: str | None) -> set[str]:
    """The labels that flag: FLAG_LABELS, else every label (but NEGATIVE_LABEL); refused where the model has no
    classes to decide or lacks a named label."""
    if view.decides not in (BEST, THRESHOLDS):
        raise ServiceError(
            tei_errors.BACKEND, f"moderation needs a classifier; this model is {view.problem}", reason="model_type"
        )
    unknown = [label for label in [*named, *([negative] if negative else [])] if label not in view.labels]
    if unknown:
        raise ServiceError(
            tei_errors.BACKEND,
            f"FLAG_LABELS / NEGATIVE_LABEL name {', '.join(map(repr, unknown))}, which the model lacks (its labels: "
            f"{', '.join(view.labels)})",
            reason="model_type",
        )
    return set(named) if named else set(view.labels) - {negative}
