"""Request and response bodies as TEI defines them (router/src/http/types.rs, router/src/lib.rs). Used by the routes."""

from __future__ import annotations

from typing import ClassVar, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, field_validator
from pydantic_core import to_json

from inference.answers import Sequence
from inference.tei_errors import INPUTS_HELP


class Json(JSONResponse):
    """JSON written by pydantic-core, ~7x faster than json.dumps; non-finite scores as null, like TEI."""

    def render(self, content) -> bytes:
        return to_json(content, inf_nan_mode="null")


class PredictParameters(BaseModel):
    """The Hugging Face Inference API's `parameters` (what `InferenceClient.text_classification` sends)."""

    model_config = ConfigDict(extra="ignore")
    top_k: StrictInt | None = Field(None, ge=1, description="Return only the k best labels.")
    function_to_apply: Literal["softmax", "sigmoid", "none"] | None = Field(
        None,
        description="Scores from logits: softmax, sigmoid, or none (the logits). Default: the model's problem type "
        "(softmax for single-label, sigmoid for multi-label and one-output models, none for regression).",
    )


class PredictRequest(BaseModel):
    inputs_help: ClassVar[str] = INPUTS_HELP  # what a wrong `inputs` is told to send instead

    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "examples": [
                {"inputs": "Stocks rallied as oil prices fell"},
                {"inputs": [["Stocks rallied"], ["The Yankees won the pennant"]], "top_k": 1},
            ]
        },
    )

    inputs: StrictStr | list[StrictStr] | list[list[StrictStr]] = Field(
        description=(
            'One text ("a" or ["a"]), one text pair (["a", "b"]), or a batch of texts and pairs ([["a"], ["b", "c"]]).'
        )
    )
    truncate: StrictBool | None = Field(
        None,
        description=(
            "Cut inputs longer than the model's maximum; false: such inputs get 422; null or absent: the server's "
            "AUTO_TRUNCATE."
        ),
    )
    truncation_direction: Literal["Right", "Left", "right", "left"] = Field(
        "Right", description="Right keeps the start of a long input, Left keeps its end."
    )
    raw_scores: StrictBool = Field(False, description="Return logits instead of scores.")
    top_k: StrictInt | None = Field(None, ge=1, description="Return only the k best labels (an extension of TEI).")
    parameters: PredictParameters | None = Field(
        None, description="Inference API parameters: top_k, function_to_apply."
    )

    @field_validator("inputs")
    @classmethod
    def _tei_shapes(cls, value):
        if isinstance(value, str):
            return value
        if not value:
            raise ValueError(f"an empty list; send {INPUTS_HELP}")
        if isinstance(value[0], str):
            if len(value) > 2:
                raise ValueError(
                    f"a list of {len(value)} strings is neither one text nor a pair; send a batch as "
                    '[["text 1"], ["text 2"], ...]'
                )
            return value
        for i, item in enumerate(value):
            if len(item) not in (1, 2):
                raise ValueError(f"item {i} holds {len(item)} strings; each batch item is [text] or [text, text_pair]")
        return value

    @property
    def is_batch(self) -> bool:
        return isinstance(self.inputs, list) and bool(self.inputs) and isinstance(self.inputs[0], list)

    def sequences(self) -> list[Sequence]:
        """Every input as (text, text_pair or None), in order."""
        items = self.inputs if self.is_batch else [[self.inputs] if isinstance(self.inputs, str) else self.inputs]
        return [(item[0], item[1] if len(item) == 2 else None) for item in items]

    @property
    def left(self) -> bool:
        return self.truncation_direction.lower() == "left"

    def k(self) -> int | None:
        return self.top_k or (self.parameters.top_k if self.parameters else None)

    def scoring(self) -> str | None:
        """softmax, sigmoid or none; None: the problem type decides."""
        if self.raw_scores:
            return "none"
        return self.parameters.function_to_apply if self.parameters else None


class RerankRequest(BaseModel):
    """TEI's RerankRequest (router/src/http/types.rs)."""

    model_config = ConfigDict(extra="ignore", json_schema_extra={"examples": [{"query": "q", "texts": ["a", "b"]}]})
    query: StrictStr
    texts: list[StrictStr]
    truncate: StrictBool | None = Field(None, description="As /predict's: null or absent means AUTO_TRUNCATE.")
    truncation_direction: Literal["Right", "Left", "right", "left"] = "Right"
    raw_scores: StrictBool = Field(False, description="The model's output itself instead of its sigmoid.")
    return_text: StrictBool = Field(False, description="Each rank also carries its text.")

    @property
    def left(self) -> bool:
        return self.truncation_direction.lower() == "left"


class Rank(BaseModel):
    index: int
    text: str | None = None  # only with return_text (TEI skips it otherwise)
    score: float


class TokenizeRequest(BaseModel):
    """TEI's TokenizeRequest: one text or a batch."""

    inputs_help: ClassVar[str] = 'a string or a list of strings ["text 1", "text 2", ...] (each tokenized alone)'
    model_config = ConfigDict(extra="ignore")
    inputs: StrictStr | list[StrictStr]
    add_special_tokens: StrictBool = True
    prompt_name: StrictStr | None = Field(
        None, description="Sentence Transformers prompts: refused, as TEI refuses it for a model without them."
    )


class SimpleToken(BaseModel):
    id: int
    text: str
    special: bool
    start: int | None  # byte offsets; None for special tokens
    stop: int | None


class DecodeRequest(BaseModel):
    """TEI's DecodeRequest: ids, or a batch of them."""

    token_ids: ClassVar[bool] = True  # as many values as the texts had tokens (json_bounds.check)
    model_config = ConfigDict(extra="ignore")
    ids: list[StrictInt] | list[list[StrictInt]]
    skip_special_tokens: StrictBool = True

    @field_validator("ids")
    @classmethod
    def _token_ids(cls, value):
        """A negative id named where it is."""
        batch = bool(value) and isinstance(value[0], list)
        for i, ids in enumerate(value if batch else [value]):
            for j, token_id in enumerate(ids):
                if token_id < 0:
                    where = f"[{i}][{j}]" if batch else f"[{j}]"
                    raise ValueError(f"ids{where} is {token_id}; token ids are 0 or more")
        return value

    @property
    def is_batch(self) -> bool:
        return bool(self.ids) and isinstance(self.ids[0], list)

    def sequences(self) -> list[list[int]]:
        return self.ids if self.is_batch else [self.ids]


class Prediction(BaseModel):
    score: float
    label: str


PredictResponse = list[Prediction] | list[list[Prediction]]


class ErrorBody(BaseModel):
    error: str
    error_type: str = Field(
        description="TEI's ErrorType: Empty, Validation, Tokenizer, Overloaded, Unhealthy, "
        "Backend; ours: Unauthorized, NotFound, MethodNotAllowed."
    )


class ClassifierModel(BaseModel):
    id2label: dict[str, str]
    label2id: dict[str, int]


class Info(BaseModel):
    """TEI's Info, then ours under `distilbert_agnews`."""

    model_id: str
    model_sha: str | None
    model_dtype: str
    served_model_name: str
    model_type: dict[Literal["classifier", "reranker"], ClassifierModel] = Field(
        description="TEI's ModelType of a classifier (router/src/lib.rs): `classifier` with two or more labels, "
        "`reranker` with one."
    )
    max_concurrent_requests: int
    max_input_length: int
    max_batch_tokens: int
    max_batch_requests: int | None
    max_client_batch_size: int
    auto_truncate: bool
    tokenization_workers: int
    version: str
    sha: str | None = None
    docker_label: str | None = None
    distilbert_agnews: dict = Field(
        description="Checkpoint file and SHA-256, training metrics, reloads, device, runtime, problem type."
    )
