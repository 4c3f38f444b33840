"""TEI's POST /tokenize and /decode (router/src/http/server.rs), on a copy of the served tokenizer."""

from __future__ import annotations

import asyncio
import threading

from fastapi import Request
from tokenizers import Tokenizer

from contract.loading import LoadedModel
from inference import errors
from inference.errors import ServiceError
from inference.routes import (
    CHARS_PER_TOKEN_LIMIT,
    ERROR_RESPONSES,
    check_batch_size,
    parse,
    require_json,
    router,
    service,
    unless_gone,
)
from inference.schemas import DecodeRequest, Json, SimpleToken, TokenizeRequest
from inference.service import Service

CHECK_EVERY = 4096  # tokens between client checks


class Stopped(Exception):
    """The request ended while listing tokens."""


class SpareTokenizer:
    """A plain copy of the served tokenizer per model, shared read-only."""

    def __init__(self):
        self._for: LoadedModel | None = None
        self._tokenizer: Tokenizer | None = None
        self._lock = threading.Lock()

    def of(self, loaded: LoadedModel) -> Tokenizer:
        with self._lock:
            if self._for is not loaded:
                backend = getattr(loaded.tokenizer, "backend_tokenizer", None)
                if backend is None:  # a Python-only tokenizer (no `tokenizers` backend): TEI serves none either
                    raise ServiceError(errors.TOKENIZER, "this model's tokenizer has no fast (Rust) backend to copy")
                copy = Tokenizer.from_str(backend.to_str())
                copy.no_truncation()
                copy.no_padding()
                self._for, self._tokenizer = loaded, copy
            return self._tokenizer


spare = SpareTokenizer()


@router.post("/tokenize", response_model=list[list[SimpleToken]], responses=ERROR_RESPONSES, summary="Tokens (TEI)")
async def tokenize(request: Request) -> Json:
    state = service(request)
    require_json(request)
    body = parse(await request.body(), TokenizeRequest)
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    _check_batch(state, texts, "inputs", batch=not isinstance(body.inputs, str))
    if body.prompt_name is not None:  # TEI (core/src/tokenization.rs prepare_pre_prompt), for a model without them
        raise ServiceError(
            errors.VALIDATION,
            f"Input validation error: `default-prompt-name` is set to `{body.prompt_name}` but no prompts were "
            "found in the Sentence Transformers configuration",
        )
    loaded = state.live_engine().current
    limit = loaded.max_length * CHARS_PER_TOKEN_LIMIT  # TEI's tokenize_input: no truncation, refused past it
    for text in texts:
        if len(text) > limit:
            raise ServiceError(
                errors.VALIDATION, f"`inputs` must have less than {limit} characters. Given: {len(text)}"
            )
    tokenizer = spare.of(loaded)
    stop = threading.Event()
    try:
        work = asyncio.ensure_future(asyncio.to_thread(tokens_of, tokenizer, texts, body.add_special_tokens, stop))
        return Json(await unless_gone(request, work))
    finally:
        stop.set()  # the worker ends at its next look


def tokens_of(tokenizer: Tokenizer, texts: list[str], add_special_tokens: bool, stop: threading.Event) -> list:
    """TEI's into_tokens: id, text, special, byte offsets."""
    answer = []
    for text, encoding in zip(texts, tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)):
        to_bytes = ByteOffsets(text)
        row = []
        for n, (token_id, name, (start, stop_at), special) in enumerate(
            zip(encoding.ids, encoding.tokens, encoding.offsets, encoding.special_tokens_mask)
        ):
            if n % CHECK_EVERY == 0 and stop.is_set():
                raise Stopped
            if special:
                row.append({"id": token_id, "text": name, "special": True, "start": None, "stop": None})
            else:
                first, last = to_bytes(start), to_bytes(stop_at)
                row.append(
                    {"id": token_id, "text": text[start:stop_at], "special": False, "start": first, "stop": last}
                )
        answer.append(row)
    return answer


class ByteOffsets:
    """Character offsets to UTF-8 byte offsets, in one pass."""

    def __init__(self, text: str):
        self.text, self.ascii = text, text.isascii()
        self.char, self.byte = 0, 0

    def __call__(self, char: int) -> int:
        if self.ascii:
            return char
        if char < self.char:  # a step back (rare: overlapping offsets): count from the start
            self.char, self.byte = 0, 0
        self.byte += len(self.text[self.char : char].encode())
        self.char = char
        return self.byte


@router.post("/decode", response_model=list[str], responses=ERROR_RESPONSES, summary="Text from token ids (TEI)")
async def decode(request: Request) -> Json:
    state = service(request)
    require_json(request)
    body = parse(await request.body(), DecodeRequest)
    sequences = body.sequences()
    _check_batch(state, sequences, "ids", batch=body.is_batch)
    tokenizer = spare.of(state.live_engine().current)
    return Json(await asyncio.to_thread(_decoded, tokenizer, sequences, body.skip_special_tokens))


def _decoded(tokenizer: Tokenizer, sequences: list[list[int]], skip_special_tokens: bool) -> list[str]:
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    for ids in sequences:
        unknown = [i for i in ids if i >= size]
        if unknown:  # TEI: the tokenizer's own error, as a Tokenizer error (422)
            raise ServiceError(errors.TOKENIZER, f"tokenizer error id {unknown[0]} is out of the vocabulary")
    return tokenizer.decode_batch(sequences, skip_special_tokens=skip_special_tokens)


def _check_batch(state: Service, items: list, field: str, batch: bool) -> None:
    """TEI's batch checks: not empty, within MAX_CLIENT_BATCH_SIZE."""
    if not batch:
        return
    try:
        if not items:
            raise ServiceError(errors.EMPTY, f"`{field}` cannot be empty", reason="validation")
        check_batch_size(state.settings, len(items))
    except ServiceError as exc:
        state.metrics.request_failure.labels(exc.reason).inc()
        raise
