"""Request and response bodies of /predict (compatible with text-embeddings-inference's /predict)."""

from __future__ import annotations

from typing import Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", json_schema_extra={"examples": [
        {"inputs": "Stocks rallied as oil prices fell"},
        {"inputs": ["Stocks rallied", "The Yankees won the pennant"], "top_k": 1},
    ]})

    inputs: Union[StrictStr, list[StrictStr], list[list[StrictStr]]] = Field(
        description="One text, a list of texts (a batch), or TEI's batch form [[text], [text], ...].")
    top_k: Optional[StrictInt] = Field(None, ge=1, description="Return only the k best labels (default: all).")
    truncate: StrictBool = Field(True, description="Cut texts longer than the model's maximum; false -> 422.")
    raw_scores: StrictBool = Field(False, description="Return logits instead of softmax probabilities.")


class Prediction(BaseModel):
    label: str
    score: float


class ErrorBody(BaseModel):
    error: str
    error_type: str


PredictResponse = Union[list[Prediction], list[list[Prediction]]]
