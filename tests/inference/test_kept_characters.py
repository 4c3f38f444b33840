"""Only the characters truncation keeps are tokenized."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from contract.loading import LoadedModel
from inference.encoding import KEPT_CHARS_PER_TOKEN, encode_unchecked, kept_part
from inference.front_end.routes import CHARS_PER_TOKEN_LIMIT, limit_characters
from inference.tei_errors import ServiceError

WORDS = (
    "officials said on monday that the markets rallied after reuters reported unbelievable earnings , 1234 .".split()
)


@pytest.fixture(scope="module")
def tokenizer(smoke_checkpoint):
    return AutoTokenizer.from_pretrained(smoke_checkpoint / "tokenizer")


def served(tokenizer, max_length: int) -> LoadedModel:
    """What encode reads of a loaded model: its tokenizer and maximum length."""
    return LoadedModel(None, tokenizer, ["a"], max_length, torch.device("cpu"), "fp32", "m", Path("."), "w", "s")


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) + ("\n" if rng.random() < 0.02 else "") for _ in range(words))


class Counting:
    """The tokenizer, counting the characters it is given (what tokenizing costs)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.chars = tokenizer, 0

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)

    def __setattr__(self, name, value):
        if name in ("tokenizer", "chars"):
            object.__setattr__(self, name, value)
        else:
            setattr(self.tokenizer, name, value)

    def __call__(self, texts, pairs=None, **options):
        self.chars += sum(len(t) for t in texts) + sum(len(p) for p in pairs or [])
        return self.tokenizer(texts, pairs, **options)


@pytest.mark.parametrize("left", [False, True], ids=["right", "left"])
def test_long_inputs_give_the_ids_of_the_whole_inputs_truncated_from_their_kept_parts(tokenizer, left):
    rng = random.Random(1)
    for max_length in (64, 128, 512):
        long = max_length * KEPT_CHARS_PER_TOKEN  # characters: past it, a side is tokenized from its kept part
        inputs = [
            (text(rng, long), None),  # about 7 times the kept part
            (text(rng, long // 3), text(rng, long // 2)),  # both sides of a pair cut
            (text(rng, 20), text(rng, long // 3)),  # one side
            (text(rng, long // 7), text(rng, long // 3)),  # one side cut, the other nearly as long
            ("x" * 30 + " ", None),
        ]
        query = text(rng, long // 2)
        inputs += [(query, text(rng, 30)), (query, text(rng, 40))]  # a rerank: one query, several texts
        sent = limit_characters(inputs, max_length * CHARS_PER_TOKEN_LIMIT, truncate=True, left=left)
        got = encode_unchecked(served(tokenizer, max_length), sent, truncate=True, left=left)
        tokenizer.truncation_side = "left" if left else "right"
        for (a, b), feature in zip(inputs, got):
            whole = tokenizer(a, b, truncation=True, max_length=max_length)["input_ids"]
            assert feature["input_ids"] == whole, (max_length, left, a[:40])


@pytest.mark.parametrize("left", [False, True], ids=["right", "left"])
def test_tokenizing_costs_what_the_model_keeps_not_what_was_sent(tokenizer, left):
    """Huge requests hand the tokenizer only their kept parts."""
    rng, max_length = random.Random(2), 512
    kept = max_length * KEPT_CHARS_PER_TOKEN
    query, documents = text(rng, 120_000), [text(rng, 8_000) for _ in range(32)]
    requests = {
        "rerank": [(query, text(rng, 10)) for _ in range(32)],
        "documents": [(d, None) for d in documents],
        "pairs": [(documents[2 * k], documents[2 * k + 1]) for k in range(16)],
    }
    for name, inputs in requests.items():
        sent = limit_characters(inputs, max_length * CHARS_PER_TOKEN_LIMIT, truncate=True, left=left)
        counting = Counting(tokenizer)
        encode_unchecked(served(counting, max_length), sent, truncate=True, left=left)
        sides = 1 if name == "rerank" else len(inputs) * (2 if name == "pairs" else 1)  # long sides, each once
        sent_chars = sum(len(a) + len(b or "") for a, b in sent)
        assert counting.chars <= 2 * kept * sides + kept // 2 * len(inputs) < sent_chars / 2, (name, counting.chars)


def test_a_kept_part_with_too_few_tokens_is_tokenized_whole(tokenizer):
    """Long tokens or much whitespace: the kept part holds fewer tokens than the model keeps, so the whole (TEI-bounded)
    side is tokenized instead, and the ids stay exact."""
    max_length = 64
    spaced = "    ".join(["markets"] * 400)  # 11 characters per token
    glued = " ".join(["unbelievableearnings" * 6] * 200)  # one unknown token per 121 characters
    for a, b in ((spaced, None), (glued, None), ("officials said", glued), (glued, spaced)):
        sent = limit_characters([(a, b)], max_length * CHARS_PER_TOKEN_LIMIT, truncate=True, left=False)
        [feature] = encode_unchecked(served(tokenizer, max_length), sent, truncate=True, left=False)
        tokenizer.truncation_side = "right"
        assert feature["input_ids"] == tokenizer(a, b, truncation=True, max_length=max_length)["input_ids"]


def test_a_cut_falls_on_whitespace_and_keeps_the_start_or_the_end():
    words = "alpha beta gamma delta " * 20
    start, end = kept_part(words, 50, left=False), kept_part(words, 50, left=True)
    assert words.startswith(start) and words.endswith(end)
    assert len(start) <= 50 and len(end) <= 50 and start.endswith("a") and end[0].isspace()
    assert kept_part("x" * 500, 50, left=False) == "x" * 50  # no whitespace near the cut: cut there
    assert kept_part("short", 50, left=True) == "short"


def test_without_truncation_an_input_over_tei_s_character_bound_is_refused_uncut():
    limit = 64 * CHARS_PER_TOKEN_LIMIT
    kept = limit_characters([("a " * 1000, None)], limit, truncate=False, left=False)
    assert kept[0][0] == "a " * 1000  # not cut: counted whole by the tokenizer, refused there if too long
    with pytest.raises(ServiceError, match=f"must have less than {limit} characters. Given: {limit + 1}"):
        limit_characters([("a" * limit, "b")], limit, truncate=False, left=False)
