"""The front-end's tokenizing: the served model's tokenizer (and each adapter's), rebuilt from what the engine sends
once per model version, encodes each request on a thread of this process, so the engine only batches ids and runs
forward passes. Called by routes.queue_sequences; the engine's side is Service.encoding. Imports no torch.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tokenizers import Tokenizer

from contract.long_text import LongText
from inference.answers import Encoded, ModelView, Sequence
from inference.encoding import Tokenizing, check_length, check_tokens, encode_request, encode_unchecked

# One thread: a tokenizer's truncation side is set per call, and the Rust encode lets the event loop run meanwhile.
ENCODING = ThreadPoolExecutor(1, thread_name_prefix="encode")
# a loop turn asking fewer characters is encoded on the loop itself: the thread's hand-off and wake-up back cost more
# than tokenizing them (per-request latency of one client: 0.95x the engine that tokenized, 53a86bc, with the hop)
INLINE_CHARS = 2048


def rebuilt(spec: dict) -> Tokenizing:
    """A front-end's copy of what the engine encodes with (Service.encoding's spec)."""
    from transformers import PreTrainedTokenizerFast  # the wrapper only: no torch, no model classes

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(spec["tokenizer"]),
        model_input_names=spec["input_names"],
        chat_template=spec.get("chat_template"),
    )
    return Tokenizing(tokenizer, spec["max_length"], LongText(**spec["long_text"]))


class Encoders:
    """Each (model version, adapter)'s Tokenizing, fetched from the engine when first needed; what one loop turn
    asks to encode is encoded together, one tokenizer call per model and setting (as the engine batched it)."""

    def __init__(self, fetch):
        self._fetch = fetch  # async (adapter) -> the engine's spec for its current version
        self._built: dict[str | None, tuple[int, Tokenizing]] = {}
        self._pending: list[_Request] = []
        self._threaded = 0  # encodings handed to the thread and not back: the loop encodes nothing meanwhile

    async def for_version(self, view: ModelView, adapter: str | None, fresh: bool = False) -> tuple[int, Tokenizing]:
        """(version, Tokenizing) for `view`'s version, or the engine's newer one; `fresh` asks the engine again."""
        found = self._built.get(adapter)
        if fresh or found is None or found[0] < view.version:
            spec = await self._fetch(adapter)
            found = (spec["version"], await asyncio.get_running_loop().run_in_executor(ENCODING, rebuilt, spec))
            self._built[adapter] = found
        return found

    async def encode(
        self,
        view: ModelView,
        adapter: str | None,
        sequences: list[Sequence],
        options: tuple[bool, bool, bool, int, bool],
        fresh: bool = False,
    ) -> Encoded:
        """`sequences` as ids for the engine, or the request's refusal; `options`: truncate, left, chunk, max chunks,
        special tokens (and the prompt template) added."""
        version, model = await self.for_version(view, adapter, fresh)
        loop = asyncio.get_running_loop()
        request = _Request(version, model, sequences, options, loop.create_future())
        self._pending.append(request)
        if len(self._pending) == 1:
            loop.call_soon(self._flush, loop)
        return await request.future

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        pending, self._pending = self._pending, []
        characters = sum(len(text) + len(pair or "") for r in pending for text, pair in r.sequences)
        if not self._threaded and characters <= INLINE_CHARS:  # the thread holds no tokenizer now
            _settle(encode_together(pending))
            return
        self._threaded += 1
        done = loop.run_in_executor(ENCODING, lambda: loop.call_soon_threadsafe(_settle, encode_together(pending)))
        done.add_done_callback(lambda d: self._threaded_done(d, pending))

    def _threaded_done(self, done: asyncio.Future, pending: list[_Request]) -> None:
        self._threaded -= 1
        if done.exception():
            _settle([(r.future, done.exception()) for r in pending])


@dataclass(eq=False)
class _Request:
    version: int
    model: Tokenizing
    sequences: list[Sequence]
    options: tuple[bool, bool, bool, int, bool]  # truncate, left, chunk, max chunks, special tokens added
    future: asyncio.Future


def encode_together(requests: list[_Request]) -> list[tuple[asyncio.Future, Encoded | Exception]]:
    """Requests of one model and truncation setting in one tokenizer call, then each checked alone (a refusal fails
    its own request); windowed ones one at a time. Each request's outcome, to settle in one loop wake-up."""
    settled = []
    groups: dict[tuple, list[_Request]] = {}
    for request in requests:
        groups.setdefault((id(request.model), *request.options), []).append(request)
    for group in groups.values():
        started = time.perf_counter()
        model, (truncate, left, chunk, _, special) = group[0].model, group[0].options
        try:
            texts = [s for r in group for s in r.sequences]
            together = [] if chunk else encode_unchecked(model, texts, truncate, left, special)
        except Exception as exc:  # noqa: BLE001 - the tokenizer failed: every request of the call is answered with it
            settled += [(request.future, exc) for request in group]
            continue
        for request in group:
            features, together = together[: len(request.sequences)], together[len(request.sequences) :]
            settled.append((request.future, _checked(request, features, time.perf_counter() - started)))
    return settled


def _checked(request: _Request, features: list[dict], seconds: float) -> Encoded | Exception:
    """The request's Encoded (its windows computed here when it chunks), or its refusal."""
    model, (truncate, left, chunk, max_chunks, _) = request.model, request.options
    try:
        if chunk:
            features, owner = encode_request(model, request.sequences, truncate, left, chunk, max_chunks)
        else:
            check_length(model, features)
            owner = list(range(len(features)))
            check_tokens(features, owner, len(request.sequences))
    except Exception as exc:  # noqa: BLE001 - a refusal (or a tokenizer failure) answers its own request
        return exc
    types = [f["token_type_ids"] for f in features] if features and "token_type_ids" in features[0] else None
    return Encoded([f["input_ids"] for f in features], types, owner, len(request.sequences), request.version, seconds)


def _settle(settled: list) -> None:
    for future, outcome in settled:
        if future.done():  # the client left meanwhile
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
