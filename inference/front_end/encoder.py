"""The front-end's tokenizing: the served model's tokenizer (and each adapter's), rebuilt from what the engine sends
once per model version, encodes each request on a thread of this process, so the engine only batches ids and runs
forward passes. Called by routes.queue_sequences; the engine's side is Service.encoding. Imports no torch.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from tokenizers import Tokenizer

from contract.long_text import LongText
from inference.answers import Encoded, ModelView, Sequence
from inference.encoding import Tokenizing, encode_request

# One thread: a tokenizer's truncation side is set per call, and the Rust encode lets the event loop run meanwhile.
ENCODING = ThreadPoolExecutor(1, thread_name_prefix="encode")


def rebuilt(spec: dict) -> Tokenizing:
    """A front-end's copy of what the engine encodes with (Service.encoding's spec)."""
    from transformers import PreTrainedTokenizerFast  # the wrapper only: no torch, no model classes

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(spec["tokenizer"]), model_input_names=spec["input_names"]
    )
    return Tokenizing(tokenizer, spec["max_length"], LongText(**spec["long_text"]))


class Encoders:
    """Each (model version, adapter)'s Tokenizing, fetched from the engine when first needed."""

    def __init__(self, fetch):
        self._fetch = fetch  # async (adapter) -> the engine's spec for its current version
        self._built: dict[str | None, tuple[int, Tokenizing]] = {}

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
        options: tuple[bool, bool, bool, int],
        fresh: bool = False,
    ) -> Encoded:
        """`sequences` as ids for the engine, or the request's refusal; `options`: truncate, left, chunk, max chunks."""
        version, model = await self.for_version(view, adapter, fresh)
        started = time.perf_counter()
        features, owner = await asyncio.get_running_loop().run_in_executor(
            ENCODING, encode_request, model, sequences, *options
        )
        types = [f["token_type_ids"] for f in features] if features and "token_type_ids" in features[0] else None
        ids = [f["input_ids"] for f in features]
        return Encoded(ids, types, owner, len(sequences), version, time.perf_counter() - started)
