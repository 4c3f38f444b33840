"""What the engine answers and how the served model looks to the routes, as plain data: no torch, so a front-end
process that only speaks HTTP holds it, and it travels between processes as JSON. Used by the engine, the routes
and the link between them (link.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

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
    thresholds: list[float]
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

    @property
    def id2label(self) -> dict[str, str]:
        return {str(i): label for i, label in enumerate(self.labels)}

    def named(self, adapter: str | None) -> ModelView:
        """This model (None), or its adapter of that name."""
        return self if adapter is None else self.adapters[adapter]

    def wire(self) -> dict:
        return asdict(self)

    @classmethod
    def from_wire(cls, said: dict) -> ModelView:
        adapters = {name: cls.from_wire(one) for name, one in said["adapters"].items()}
        return cls(**{**said, "adapters": adapters})


@dataclass
class Answer:
    """One job's answer: each input's labels, best first, with their scores; the model's version and timings."""

    ranked: list[list[dict]]
    compute: str  # "cpu" or "gpu"
    version: int
    tokens: int
    tokenization_s: float
    queue_s: float
    inference_s: float

    def wire(self) -> dict:
        return asdict(self)


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
