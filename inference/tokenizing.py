"""Requests' inputs to model features: texts and pairs tokenized in one call per kind, truncated (the start or the
end kept) or refused when too long, or cut into the windows config.json asks for (contract/long_text.py); and the
errors that refuse an input (REFUSALS), which the routes answer as TEI answers an invalid input."""

from __future__ import annotations

from dataclasses import replace

from contract.loading import LoadedModel
from contract.long_text import CHUNK, LongTextError, PairLeavesNoRoom, TooManyWindows, cut_long_pairs
from inference.schemas import Sequence


class InputTooLong(ValueError):
    """An input over the model's maximum with truncation off (TEI's wording)."""

    def __init__(self, tokens: int, limit: int):
        super().__init__(f"`inputs` must have less than {limit} tokens. Given: {tokens}")


# What the engine answers a job with when its inputs cannot be served (not a failure of the model): the routes
# answer each as TEI answers an invalid input (inference/routes.py engine_failure).
REFUSALS = (InputTooLong, TooManyWindows, LongTextError)


def encode(loaded: LoadedModel, sequences: list[Sequence], truncate: bool, left: bool) -> list[dict]:
    """Token ids (and token type ids where the model takes them) of each input, texts and pairs alike.
    Truncation keeps the start (right) or the end (left) of a long input; pairs are cut longest first.
    InputTooLong when an input is longer than the model takes."""
    features = encode_unchecked(loaded, sequences, truncate, left)
    check_length(loaded, features)
    return features


def check_length(loaded: LoadedModel, features: list[dict]) -> None:
    """InputTooLong when an input is longer than the model takes."""
    longest = max(len(f["input_ids"]) for f in features)
    if longest > loaded.max_length:
        raise InputTooLong(longest, loaded.max_length)


def encode_unchecked(loaded: LoadedModel, sequences: list[Sequence], truncate: bool, left: bool) -> list[dict]:
    """encode without the length check (the caller checks each job's inputs): one tokenizer call per kind."""
    tokenizer = loaded.tokenizer
    tokenizer.truncation_side = "left" if left else "right"  # under Engine._tokenizing (and at warm-up)
    options = {
        "truncation": truncate,
        "max_length": loaded.max_length if truncate else None,
        "return_attention_mask": False,
    }
    features: list[dict | None] = [None] * len(sequences)
    for where, texts, pairs in by_kind(sequences):
        if pairs is not None and truncate:  # each side cut to what truncation keeps: a bounded cost per pair
            texts, pairs = cut_long_pairs(tokenizer, texts, pairs, loaded.max_length, left)
        encoded = tokenizer(texts, pairs, **options)
        for k, i in enumerate(where):
            features[i] = {name: encoded[name][k] for name in ("input_ids", "token_type_ids") if name in encoded}
    return features


def windows(loaded: LoadedModel, sequences: list[Sequence], max_chunks: int) -> tuple[list[dict], list[int]]:
    """(every window of each input, the input of each window), texts and pairs alike, windowed as the model's
    config.json says (contract/long_text.py); TooManyWindows beyond `max_chunks` windows for one input."""
    chunking = replace(loaded.long_text, mode=CHUNK)
    loaded.tokenizer.truncation_side = "right"  # under Engine._tokenizing
    chunking.refuse_too_long(loaded.tokenizer, sequences, window_length(loaded), max_chunks)
    per_input: list[list[dict]] = [[] for _ in sequences]
    for where, texts, pairs in by_kind(sequences):
        try:
            found = chunking.encode(loaded.tokenizer, texts, pairs, window_length(loaded), max_chunks)
        except PairLeavesNoRoom as exc:  # its index is among the pairs: name the request's input
            raise LongTextError(f"inputs[{where[exc.index]}]: {exc.detail}") from None
        for feature, k in zip(found.features, found.owner):
            per_input[where[k]].append(feature)
    return [f for found in per_input for f in found], [i for i, found in enumerate(per_input) for _ in found]


def by_kind(sequences: list[Sequence]):
    """(input indices, texts, pairs or None) for the single texts, then for the pairs: one tokenizer call each."""
    for is_pair in (False, True):
        where = [i for i, (_, pair) in enumerate(sequences) if (pair is not None) == is_pair]
        if where:
            yield where, [sequences[i][0] for i in where], [sequences[i][1] for i in where] if is_pair else None


def window_length(loaded: LoadedModel) -> int:
    """Tokens per window when chunking: as in training (config.json), at most the model's maximum."""
    return min(loaded.long_text.window or loaded.max_length, loaded.max_length)
