"""TEI's POST /tokenize and /decode (router/src/http/server.rs), on a copy of the served tokenizer."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from pydantic_core import to_json
from tokenizers import Tokenizer

from inference import memory, tei_errors
from inference.answers import Overloaded
from inference.front_end.link import AppState
from inference.front_end.routes import (
    CHARS_PER_TOKEN_LIMIT,
    ERROR_RESPONSES,
    check_batch_size,
    guarded,
    live_view,
    parse,
    require_json,
    service,
    unless_gone,
)
from inference.front_end.schemas import DecodeRequest, Json, SimpleToken, TokenizeRequest
from inference.tei_errors import ServiceError

CHUNK_TOKENS = 4096  # tokens formatted per piece of a streamed answer
TOKENIZE_PAYLOADS = 8  # /tokenize answers at most this many full request bodies of text at once; past it 429
TRIM_AFTER_BYTES = 1 << 20  # of text: after such a request the freed heap goes back to the system
TOKENIZING = ThreadPoolExecutor(2, thread_name_prefix="tokenize")  # texts being encoded at once: their peak memory


def spare_copy(serialized: str) -> Tokenizer:
    """The served tokenizer from its JSON, untruncated and unpadded: the engine's own settings never reach it."""
    copy = Tokenizer.from_str(serialized)
    copy.no_truncation()
    copy.no_padding()
    return copy


router = guarded()


@router.post("/tokenize", response_model=list[list[SimpleToken]], responses=ERROR_RESPONSES, summary="Tokens (TEI)")
async def tokenize(request: Request) -> Response:
    state = service(request)
    require_json(request)
    body = parse(state, await request.body(), TokenizeRequest)
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    _check_batch(state, texts, "inputs", batch=not isinstance(body.inputs, str))
    if body.prompt_name is not None:  # TEI (core/src/tokenization.rs prepare_pre_prompt), for a model without them
        raise ServiceError(
            tei_errors.VALIDATION,
            f"Input validation error: `default-prompt-name` is set to `{body.prompt_name}` but no prompts were "
            "found in the Sentence Transformers configuration",
        )
    limit = live_view(state).max_length * CHARS_PER_TOKEN_LIMIT  # TEI's tokenize_input: no truncation, refused past it
    for text in texts:
        if len(text) > limit:
            raise ServiceError(
                tei_errors.VALIDATION, f"`inputs` must have less than {limit} characters. Given: {len(text)}"
            )
    tokenizer = await state.link.tokenizer()
    release = await admit(state, texts)
    try:
        listed = asyncio.ensure_future(_listed(tokenizer, texts, body.add_special_tokens))
        rows = await unless_gone(request, listed)
    except BaseException:
        release()
        raise
    return Streamed(_answer(rows), release)


async def admit(state: AppState, texts: list[str]) -> Callable[[], None]:
    """Count the texts against the inputs in flight and their bytes against what /tokenize may answer at once (429
    past either); the function that gives both back."""
    size = sum(len(text.encode("utf-8", "surrogatepass")) for text in texts)
    in_flight.take(size, TOKENIZE_PAYLOADS * state.settings.payload_limit)
    try:
        await state.link.admit(len(texts))
    except Overloaded as exc:
        in_flight.give(size)
        raise ServiceError(tei_errors.OVERLOADED, str(exc)) from None
    except BaseException:
        in_flight.give(size)
        raise
    given = threading.Event()

    def release() -> None:
        if not given.is_set():
            given.set()
            in_flight.give(size)
            state.link.leave(len(texts))
            if size >= TRIM_AFTER_BYTES:  # the encodings' many small blocks, freed on other threads' heaps
                TOKENIZING.submit(memory.give_back_free_memory)

    return release


class TextInFlight:
    """Bytes of text /tokenize is answering: what bounds its memory (docs/serving.md, "Memory")."""

    def __init__(self):
        self.used = 0
        self._lock = threading.Lock()

    def take(self, size: int, limit: int) -> None:
        with self._lock:
            if self.used + size > limit:
                raise ServiceError(
                    tei_errors.OVERLOADED,
                    f"/tokenize is answering {self.used} bytes of text (limit {TOKENIZE_PAYLOADS} x PAYLOAD_LIMIT = "
                    f"{limit}); retry later",
                )
            self.used += size

    def give(self, size: int) -> None:
        with self._lock:
            self.used -= size


in_flight = TextInFlight()


class Streamed(StreamingResponse):
    """A JSON answer sent piece by piece; `release` runs once it is sent, or the client is gone."""

    def __init__(self, pieces: AsyncIterator[bytes], release: Callable[[], None]):
        super().__init__(pieces, media_type="application/json")
        self.release = release

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.release()


async def _listed(tokenizer: Tokenizer, texts: list[str], add_special_tokens: bool) -> list[Listed]:
    loop = asyncio.get_running_loop()
    return [await loop.run_in_executor(TOKENIZING, Listed.of, tokenizer, t, add_special_tokens) for t in texts]


async def _answer(rows: list[Listed]) -> AsyncIterator[bytes]:
    """TEI's list of token lists, CHUNK_TOKENS tokens formatted at a time off the event loop."""
    loop = asyncio.get_running_loop()
    yield b"["
    for n, row in enumerate(rows):
        yield b",[" if n else b"["
        for start in range(0, len(row.ids), CHUNK_TOKENS):
            piece = await loop.run_in_executor(TOKENIZING, row.json, start, start + CHUNK_TOKENS)
            yield b"," + piece if start else piece
        yield b"]"
        rows[n] = None  # sent: its arrays can go
    yield b"]"


@dataclass
class Listed:
    """One text's tokens as arrays (21 bytes a token), formatted as TEI's SimpleTokens on demand."""

    text: str
    tokenizer: Tokenizer
    ids: np.ndarray
    chars: np.ndarray  # [tokens, 2] character offsets, for each token's text
    utf8: np.ndarray  # [tokens, 2] UTF-8 offsets, what TEI answers
    special: np.ndarray

    @classmethod
    def of(cls, tokenizer: Tokenizer, text: str, add_special_tokens: bool) -> Listed:
        """One encode; byte offsets from a prefix table, O(1) each whatever the tokenizer kind."""
        encoding = tokenizer.encode(text, add_special_tokens=add_special_tokens)
        chars = np.array(encoding.offsets, dtype=np.int32).reshape(-1, 2)
        table = utf8_offsets(text)
        return cls(
            text,
            tokenizer,
            np.array(encoding.ids, dtype=np.int32),
            chars,
            chars if table is None else table[chars],
            np.array(encoding.special_tokens_mask, dtype=bool),
        )

    def json(self, start: int, stop: int) -> bytes:
        """Tokens start..stop as TEI's SimpleTokens, comma-separated (core/src/tokenization.rs into_tokens)."""
        rows = []
        for token_id, (first, last), (begin, end), special in zip(
            self.ids[start:stop].tolist(),
            self.chars[start:stop].tolist(),
            self.utf8[start:stop].tolist(),
            self.special[start:stop].tolist(),
        ):
            if special:
                name = self.tokenizer.id_to_token(token_id)
                rows.append({"id": token_id, "text": name, "special": True, "start": None, "stop": None})
            else:
                rows.append(
                    {"id": token_id, "text": self.text[first:last], "special": False, "start": begin, "stop": end}
                )
        return to_json(rows)[1:-1]


def utf8_offsets(text: str) -> np.ndarray | None:
    """Each character offset's UTF-8 byte offset (n + 1 entries, one pass), or None for ASCII (the same)."""
    if text.isascii():
        return None
    points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")
    widths = 1 + (points >= 0x80).astype(np.int32) + (points >= 0x800) + (points >= 0x10000)
    table = np.zeros(len(points) + 1, dtype=np.int32)
    np.cumsum(widths, out=table[1:])
    return table


@router.post("/decode", response_model=list[str], responses=ERROR_RESPONSES, summary="Text from token ids (TEI)")
async def decode(request: Request) -> Json:
    state = service(request)
    require_json(request)
    body = parse(state, await request.body(), DecodeRequest)
    sequences = body.sequences()
    _check_batch(state, sequences, "ids", batch=body.is_batch)
    live_view(state)
    tokenizer = await state.link.tokenizer()
    return Json(await asyncio.to_thread(_decoded, tokenizer, sequences, body.skip_special_tokens))


def _decoded(tokenizer: Tokenizer, sequences: list[list[int]], skip_special_tokens: bool) -> list[str]:
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    for ids in sequences:
        unknown = [i for i in ids if i >= size]
        if unknown:  # TEI: the tokenizer's own error, as a Tokenizer error (422)
            raise ServiceError(tei_errors.TOKENIZER, f"tokenizer error id {unknown[0]} is out of the vocabulary")
    return tokenizer.decode_batch(sequences, skip_special_tokens=skip_special_tokens)


def _check_batch(state: AppState, items: list, field: str, batch: bool) -> None:
    """TEI's batch checks: not empty, within MAX_CLIENT_BATCH_SIZE."""
    if not batch:
        return
    try:
        if not items:
            raise ServiceError(tei_errors.EMPTY, f"`{field}` cannot be empty", reason="validation")
        check_batch_size(state.settings, len(items))
    except ServiceError as exc:
        state.metrics.request_failure.labels(exc.reason).inc()
        raise
