"""/tokenize off the model thread, with O(1) byte offsets."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from inference.front_end.link import spare_copy
from inference.front_end.token_routes import CHUNK_TOKENS, Listed, utf8_offsets
from tests.helpers.tokenizer_kinds import KINDS, tokenizer_of


@pytest.fixture(scope="module")
def spare(smoke_checkpoint):
    served = AutoTokenizer.from_pretrained(smoke_checkpoint / "tokenizer")
    served.backend_tokenizer.enable_truncation(8)  # the engine's own settings never reach the copy
    return spare_copy(served.backend_tokenizer.to_str())


def tokens(row: Listed) -> list[dict]:
    """The row as the answer lists it, formatted piece by piece as the stream sends it."""
    pieces = [row.json(start, start + CHUNK_TOKENS) for start in range(0, len(row.ids), CHUNK_TOKENS)]
    return json.loads(b"[" + b",".join(pieces) + b"]")


def test_a_long_text_is_listed_whole_in_pieces(spare):
    text = "markets rallied " * (2 * CHUNK_TOKENS)
    listed = tokens(Listed.of(spare, text, True))
    assert len(listed) > 4 * CHUNK_TOKENS  # not truncated by the engine's setting on the original
    assert listed[0]["special"] and listed[-1]["special"] and listed[1]["start"] == 0
    assert listed[-2]["stop"] == len(text.rstrip())


def test_utf8_offsets_match_encoding_each_prefix():
    text = "Café naïve — 東京 ok 🔋\ud800x"  # a lone surrogate, as JSON's "\ud800" gives it, counts 3 bytes
    table = utf8_offsets(text)
    assert table.tolist() == [len(text[:p].encode("utf-8", "surrogatepass")) for p in range(len(text) + 1)]
    assert utf8_offsets("plain ascii") is None  # offsets are bytes already


class CountedText(str):
    """A text that counts how often it is encoded to bytes (the old offsets re-encoded a prefix per step back)."""

    encodes = 0

    def encode(self, *args, **kwargs):
        CountedText.encodes += 1
        return super().encode(*args, **kwargs)


@pytest.mark.parametrize("kind", KINDS)
def test_every_tokenizer_kind_gets_each_tokens_text_and_byte_offsets_from_one_pass(kind):
    tokenizer = tokenizer_of(kind)
    text = CountedText(("Café owners 🔋📈 rallied in 東京; naïve déjà vu " * 200).strip())
    CountedText.encodes = 0
    listed = tokens(Listed.of(tokenizer.backend_tokenizer, text, True))
    assert CountedText.encodes == 1  # one table for ~2,000 tokens, however many share a character
    assert [t["id"] for t in listed] == tokenizer(str(text))["input_ids"]
    raw = str(text).encode()
    words = [t for t in listed if not t["special"]]
    assert all(raw[t["start"] : t["stop"]].decode() == t["text"] for t in words)
    assert max(t["stop"] for t in words) == len(raw) > len(text)
    if kind == "byte-level-bpe":  # the case that was quadratic: tokens sharing one character's bytes
        assert any(a["start"] == b["start"] for a, b in zip(words, words[1:]))
    assert all(
        t["start"] is None and t["text"] == tokenizer.convert_ids_to_tokens(t["id"]) for t in listed if t["special"]
    )
