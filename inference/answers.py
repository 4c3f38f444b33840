"""What the engine answers and how the served model looks to the routes, as plain data: no torch, so a front-end
process that only speaks HTTP holds it, and it travels between processes as JSON. Used by the engine, the routes
and the link between them (link.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cached_property

from contract import scoring
from contract.long_text import LongTextError, TooManyWindows

Sequence = tuple[str, str | None]  # an input: (text, text_pair or None)


@dataclass(frozen=True)
class ModelView:
    """The served model as the routes need it: labels and limits to check a request, and what /info says."""

    version: int  # a new one for every model swapped in (reload, the background runtime)
    labels: list[str]
    max_length: int
    window: int  # tokens per long-text window
    chunks: bool  # long inputs are windowed, unless a request asks to truncate (LONG_TEXT or config.json)
    long_text: dict  # config.json's long-text fields
    problem: str
    decides: str  # the problem type's decision rule (contract/scoring.py decided)
    thresholds: list[float]
    review_band: dict | None  # config.json's {"precision", "ranges"}: decisions withheld inside it (contract/scoring)
    device: str
    precision: str
    runtime: dict  # the runtime choice's report
    model_sha: str | None
    folder: str
    weights_file: str
    sha256: str
    loaded_at: float
    metrics: dict | None
    reloads: int
    torch_threads: int
    adapters: dict[str, ModelView]  # the other adapters of this base, by name (LORA_ADAPTERS)
    agreement: dict | None = None  # AGREEMENT_WITH: the teacher, the bound and what was measured

    @property
    def id2label(self) -> dict[str, str]:
        return {str(i): label for i, label in enumerate(self.labels)}

    def named(self, adapter: str | None) -> ModelView:
        """This model (None), or its adapter of that name."""
        return self if adapter is None else self.adapters[adapter]

    def wire(self) -> dict:
        return asdict(self)

    def decisions(self, scores: list[list[float]], thresholds: list[float] | None = None) -> scoring.Decisions:
        """Each input's decisions as the checkpoint decides (contract/scoring.decide), the review band applied; given
        `thresholds` (a request's override) decide at them, the band left out: it was fitted around the model's."""
        band = [] if thresholds is not None or not self.review_band else self.review_band["ranges"]
        return scoring.decide(self.decides, scores, self.thresholds if thresholds is None else thresholds, band)

    def problem_card(self) -> dict:
        """/info's and /v1/models' account of how this model decides."""
        return {"name": self.problem, "decision_thresholds": self.thresholds, "review_band": self.review_band}

    @classmethod
    def from_wire(cls, said: dict) -> ModelView:
        adapters = {name: cls.from_wire(one) for name, one in said["adapters"].items()}
        return cls(**{**said, "adapters": adapters})


@dataclass
class Answer:
    """One job's answer: each input's scores in the label order of the model that computed it, its labels and
    version, and timings. The route that asked builds its client's shape from it (`ranked`: best first)."""

    scores: list[list[float]]
    labels: list[str]
    compute: str  # "cpu" or "gpu"
    version: int
    tokens: int
    tokenization_s: float
    queue_s: float
    inference_s: float

    @cached_property
    def ranked(self) -> list[list[dict]]:
        """Each input's labels, best first, with their scores: TEI's shape."""
        return scoring.ranked(self.scores, self.labels)

    def wire(self) -> dict:
        """The fields as they travel (no deep copy: dataclasses.asdict cost 18 us an answer)."""
        return {name: getattr(self, name) for name in WIRE_FIELDS}


WIRE_FIELDS = ("scores", "labels", "compute", "version", "tokens", "tokenization_s", "queue_s", "inference_s")


@dataclass
class Encoded:
    """A request's inputs as a front-end tokenized them for one model version: one id list per window (one per input
    unless long texts are windowed), the input each window belongs to. What the engine batches; it never sees text."""

    ids: list[list[int]]
    type_ids: list[list[int]] | None  # token_type_ids, for models that take them
    owner: list[int]
    inputs: int
    version: int  # the model version whose tokenizer and limits made them
    seconds: float = 0.0  # the front-end's tokenizing time

    def features(self) -> list[dict]:
        if self.type_ids is None:
            return [{"input_ids": ids} for ids in self.ids]
        return [{"input_ids": ids, "token_type_ids": types} for ids, types in zip(self.ids, self.type_ids)]

    def wire(self) -> dict:
        return {name: getattr(self, name) for name in ("ids", "type_ids", "owner", "inputs", "version")}


class Stale(RuntimeError):
    """Encoded for a model version whose tokenizer or limits are no longer served: encode again."""


class NonFinite(ArithmeticError):
    """A job whose logits hold NaN or infinity."""


class Overloaded(RuntimeError):
    """max_concurrent_requests inputs are in flight already."""


class InputTooLong(ValueError):
    """Too long, with truncation off (TEI's wording)."""

    def __init__(self, tokens: int, limit: int):
        super().__init__(f"`inputs` must have less than {limit} tokens. Given: {tokens}")


class NoTokens(ValueError):
    """An input the tokenizer makes nothing of (whitespace, zero-width characters, with no special tokens added)."""

    def __init__(self, index: int):
        super().__init__(f"`inputs` has no tokens once tokenized (inputs[{index}]): only characters this model's "
                         "tokenizer drops; send some text")  # fmt: skip


class Refused(Exception):
    """A failure the engine reported over the link: its kind and message (answers.failure)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind, self.message = kind, message


# a job's failure as the link carries it: kind -> the class the routes answer it by
FAILURES = {
    "stale": Stale,
    "overloaded": Overloaded,
    "non_finite": NonFinite,
    "no_tokens": NoTokens,
    "too_long": InputTooLong,
    "too_many_windows": TooManyWindows,
    "long_text": LongTextError,
}


def failure(exc: BaseException) -> tuple[str, str]:
    """(kind, message) of a job's failure, as the link carries it; `backend` for anything else (TEI's 424)."""
    if isinstance(exc, Refused):
        return exc.kind, exc.message
    kind = next((kind for kind, cls in FAILURES.items() if isinstance(exc, cls)), "backend")
    return kind, str(exc) if kind != "backend" else f"inference failed ({type(exc).__name__}: {exc})"
