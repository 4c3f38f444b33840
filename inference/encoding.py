"""Requests' inputs to model features: tokenized, truncated or refused, or windowed as config.json asks. Called by
the front-ends (front_end/encoder.py) for every request, and by the engine's runtimes to convert and check a model on
the same features. Imports no torch: `model` is anything with a tokenizer, a max_length and long-text settings (a
LoadedModel, or a front-end's Tokenizing).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from typing import Any

from contract.long_text import CHUNK, LongText, LongTextError, PairLeavesNoRoom, TooManyWindows, cut_long_pairs
from inference.answers import InputTooLong, NoTokens, Sequence


@dataclass(frozen=True)
class Tokenizing:
    """What encoding needs of a model, as a front-end holds it (a LoadedModel has the same attributes)."""

    tokenizer: Any  # a transformers fast tokenizer (no torch: its tensors are never asked for)
    max_length: int
    long_text: LongText


Model = Any  # a LoadedModel or a Tokenizing: the attributes above


def encode_request(
    model: Model, sequences: list[Sequence], truncate: bool, left: bool, chunk: bool, max_chunks: int
) -> tuple[list[dict], list[int]]:
    """(features, the input of each) for one request, or its refusal (REFUSALS): windows where it chunks, else one
    truncated (or refused as too long) per input; every input must have a token."""
    if chunk:
        features, owner = windows(model, sequences, max_chunks)
    else:
        features = encode_unchecked(model, sequences, truncate, left)
        check_length(model, features)
        owner = list(range(len(features)))
    check_tokens(features, owner, len(sequences))
    return features, owner


def check_tokens(features: list[dict], owner: list[int], inputs: int) -> None:
    """NoTokens for the first input without a token: a model cannot score nothing, and padding would answer for it."""
    scored = {i for feature, i in zip(features, owner) if len(feature["input_ids"])}
    for index in range(inputs):
        if index not in scored:
            raise NoTokens(index)


# truncation tokenizes only what is kept: this many characters per kept token
KEPT_CHARS_PER_TOKEN = 16
WORD_BOUNDARY_SEARCH = 256  # so no word is split

# refusals the routes answer as TEI answers invalid input
REFUSALS = (InputTooLong, TooManyWindows, LongTextError, NoTokens)


def encode(loaded: Model, sequences: list[Sequence], truncate: bool, left: bool) -> list[dict]:
    """Ids of each input, truncated at either end, or InputTooLong."""
    features = encode_unchecked(loaded, sequences, truncate, left)
    check_length(loaded, features)
    return features


def check_length(loaded: Model, features: list[dict]) -> None:
    """InputTooLong when an input is longer than the model takes."""
    longest = max(len(f["input_ids"]) for f in features)
    if longest > loaded.max_length:
        raise InputTooLong(longest, loaded.max_length)


def encode_unchecked(
    loaded: Model, sequences: list[Sequence], truncate: bool, left: bool, special: bool = True
) -> list[dict]:
    """encode without the length check; only the kept part is tokenized. `special` False: texts already rendered
    whole (a chat template's), so neither the model's special tokens nor its prompt template are added."""
    tokenizer = loaded.tokenizer
    tokenizer.truncation_side = "left" if left else "right"  # one encoding at a time per tokenizer (encoder.py)
    features: list[dict | None] = [None] * len(sequences)
    for where, texts, pairs in singles_then_pairs(sequences):
        if not truncate:
            plain = {"truncation": False, "return_attention_mask": False, "add_special_tokens": special}
            found = _features(tokenizer(texts, pairs, **plain))
        elif pairs is None:
            found = _truncated_texts(loaded, texts, left, special)
        else:
            found = _truncated_pairs(loaded, texts, pairs, left)
        for k, i in enumerate(where):
            features[i] = found[k]
    return features


def _features(encoded) -> list[dict]:
    names = [name for name in ("input_ids", "token_type_ids") if name in encoded]
    return [{name: encoded[name][k] for name in names} for k in range(len(encoded["input_ids"]))]


def _truncated(loaded: Model, texts: list[str], pairs: list[str] | None, special: bool = True) -> list[dict]:
    options = {"truncation": True, "max_length": loaded.max_length, "return_attention_mask": False}
    return _features(loaded.tokenizer(texts, pairs, add_special_tokens=special, **options))


def _truncated_texts(loaded: Model, texts: list[str], left: bool, special: bool = True) -> list[dict]:
    """Each text tokenized from its kept part, else whole."""
    kept = _kept_parts(texts, loaded.max_length * KEPT_CHARS_PER_TOKEN, left)
    found = _truncated(loaded, kept, None, special)
    short = [k for k in range(len(texts)) if kept[k] is not texts[k] and len(found[k]["input_ids"]) < loaded.max_length]
    for k, feature in zip(short, _truncated(loaded, [texts[k] for k in short], None, special) if short else []):
        found[k] = feature
    return found


def _truncated_pairs(loaded: Model, texts: list[str], pairs: list[str], left: bool) -> list[dict]:
    """Each pair tokenized from its sides' kept parts, cut longest first."""
    chars, max_length = loaded.max_length * KEPT_CHARS_PER_TOKEN, loaded.max_length
    kept_texts, kept_pairs = _kept_parts(texts, chars, left), _kept_parts(pairs, chars, left)

    def order(k: int, tokens: tuple[int, int]) -> int:
        return longer_side(tokens, (texts[k], pairs[k]), (kept_texts[k], kept_pairs[k]))

    cut_texts, cut_pairs, tokens = cut_long_pairs(loaded.tokenizer, kept_texts, kept_pairs, max_length, left, order)
    short = [
        k
        for k, counted in enumerate(tokens)
        if counted is not None
        and any(
            part is not side and n < max_length
            for part, side, n in zip((kept_texts[k], kept_pairs[k]), (texts[k], pairs[k]), counted)
        )
    ]
    if short:
        again = cut_long_pairs(loaded.tokenizer, [texts[k] for k in short], [pairs[k] for k in short], max_length, left)
        for n, k in enumerate(short):
            cut_texts[k], cut_pairs[k] = again[0][n], again[1][n]
    return _truncated(loaded, cut_texts, cut_pairs)


def longer_side(tokens: tuple[int, int], sides: tuple[str, str], kept: tuple[str, str]) -> int:
    """Which whole side is longer (1, -1, 0), estimated from the kept parts; may differ from TEI by a token
    (docs/serving.md)."""
    whole = [n if part is side else n * len(side) / len(part) for n, side, part in zip(tokens, sides, kept)]
    return (whole[0] > whole[1]) - (whole[0] < whole[1])


def _kept_parts(sides: list[str], chars: int, left: bool) -> list[str]:
    """kept_part of each distinct side."""
    done: dict[int, str] = {}
    for side in sides:
        if id(side) not in done:
            done[id(side)] = kept_part(side, chars, left)
    return [done[id(side)] for side in sides]


def kept_part(text: str, chars: int, left: bool) -> str:
    """At most `chars` characters of `text`, cut at whitespace."""
    if len(text) <= chars:
        return text
    if left:
        part = text[-chars:]
        for i in range(min(WORD_BOUNDARY_SEARCH, len(part))):
            if part[i].isspace():
                return part[i:]
        return part
    part = text[:chars]
    for i in range(len(part) - 1, max(len(part) - WORD_BOUNDARY_SEARCH, 0), -1):
        if part[i].isspace():
            return part[:i]
    return part


def windows(loaded: Model, sequences: list[Sequence], max_chunks: int) -> tuple[list[dict], list[int]]:
    """(windows, their inputs), as config.json windows; TooManyWindows past `max_chunks`."""
    chunking = replace(loaded.long_text, mode=CHUNK)
    loaded.tokenizer.truncation_side = "right"  # one encoding at a time per tokenizer (front_end/encoder.py)
    chunking.refuse_too_long(loaded.tokenizer, sequences, window_length(loaded), max_chunks)
    per_input: list[list[dict]] = [[] for _ in sequences]
    for where, texts, pairs in singles_then_pairs(sequences):
        try:
            found = chunking.encode(loaded.tokenizer, texts, pairs, window_length(loaded), max_chunks)
        except PairLeavesNoRoom as exc:  # its index is among the pairs: name the request's input
            raise LongTextError(f"inputs[{where[exc.index]}]: {exc.detail}") from None
        for feature, k in zip(found.features, found.owner):
            per_input[where[k]].append(feature)
    return [f for found in per_input for f in found], [i for i, found in enumerate(per_input) for _ in found]


def singles_then_pairs(sequences: list[Sequence]):
    """(indices, texts, pairs) per tokenizer call."""
    for is_pair in (False, True):
        where = [i for i, (_, pair) in enumerate(sequences) if (pair is not None) == is_pair]
        if where:
            yield where, [sequences[i][0] for i in where], [sequences[i][1] for i in where] if is_pair else None


def window_length(loaded: Model) -> int:
    """Tokens per window: training's, within the model's maximum."""
    return min(loaded.long_text.window or loaded.max_length, loaded.max_length)


def spec_of(model: Model) -> dict:
    """How `model` encodes, as a front-end rebuilds it (front_end/encoder.py), with a digest naming it; computed once
    per model (a reload is another model)."""
    found = getattr(model, "_encoding_spec", None)
    if found is None:
        tokenizer = model.tokenizer
        found = {
            "tokenizer": tokenizer.backend_tokenizer.to_str(),
            "input_names": list(tokenizer.model_input_names),
            "max_length": model.max_length,
            "long_text": asdict(model.long_text),
            "chat_template": getattr(tokenizer, "chat_template", None),  # /v1/classify's `messages` render through it
        }
        found["digest"] = hashlib.sha256(json.dumps(found, sort_keys=True).encode()).hexdigest()
        model._encoding_spec = found
    return found
