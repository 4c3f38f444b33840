"""/tokenize's work off the model thread (inference/token_routes.py): a copy of the served tokenizer that nothing
changes, byte offsets in one pass, and work that stops between tokens once the request has ended."""

from __future__ import annotations

import threading

import pytest
from transformers import AutoTokenizer

from inference.token_routes import CHECK_EVERY, ByteOffsets, SpareTokenizer, Stopped, tokens_of


@pytest.fixture(scope="module")
def spare(smoke_checkpoint):
    from types import SimpleNamespace

    loaded = SimpleNamespace(tokenizer=AutoTokenizer.from_pretrained(smoke_checkpoint / "tokenizer"))
    copies = SpareTokenizer()
    tokenizer = copies.of(loaded)
    assert copies.of(loaded) is tokenizer  # one copy per loaded model
    loaded.tokenizer.backend_tokenizer.enable_truncation(8)  # the engine's own settings never reach the copy
    return tokenizer


def test_a_request_that_ended_stops_the_work_between_tokens(spare):
    text = "markets rallied " * (4 * CHECK_EVERY)
    ended = threading.Event()
    ended.set()
    with pytest.raises(Stopped):
        tokens_of(spare, [text], True, ended)
    [row] = tokens_of(spare, [text], True, threading.Event())
    assert len(row) > 4 * CHECK_EVERY  # not truncated by the engine's setting on the original


def test_byte_offsets_in_one_pass_match_encoding_each_prefix():
    text = "Café naïve — 東京 ok"
    to_bytes = ByteOffsets(text)
    positions = [0, 3, 4, 5, 9, 12, 14, 15, 17, 17, len(text)]
    assert [to_bytes(p) for p in positions] == [len(text[:p].encode()) for p in positions]
    assert ByteOffsets(text)(8) == len(text[:8].encode())  # from the start again
    backwards = ByteOffsets(text)
    assert backwards(12) == len(text[:12].encode()) and backwards(3) == len(text[:3].encode())
