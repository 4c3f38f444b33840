"""Texts longer than the model's window: truncated, or cut into overlapping windows pooled per text, as config.json
says, so every reader windows as training did.

A pair is windowed along its longer side; the shorter repeats in each window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

from contract.errors import UserError

TRUNCATE, CHUNK = "truncate", "chunk"
MODES = (TRUNCATE, CHUNK)
MEAN, MAX = "mean", "max"
POOLINGS = (MEAN, MAX)
DEFAULT_STRIDE = 32
PREFIX_CHARS_PER_TOKEN = 16  # characters per token for refuse_too_long
FIELDS = ("long_text", "chunk_stride", "chunk_pooling", "chunk_max_length")  # config.json


class LongTextError(UserError, ValueError):
    """Settings that cannot window a text; names the field."""


class PairLeavesNoRoom(LongTextError):
    """A pair whose shorter text fills a window; `index` is its position."""

    def __init__(self, index: int, detail: str):
        super().__init__(f"input {index}: {detail}")
        self.index, self.detail = index, detail


class TooManyWindows(ValueError):
    """An input needing more than MAX_CHUNKS windows."""

    def __init__(self, windows: int | None, limit: int, max_length: int):
        needs = f"{windows}" if windows is not None else f"more than {limit}"
        super().__init__(
            f"an input needs {needs} windows of {max_length} tokens; at most {limit} are allowed (MAX_CHUNKS): "
            "send a shorter text, or `truncate: true` to classify its first window only"
        )


@dataclass(frozen=True)
class Windows:
    """Windows in input order: `features[k]` belongs to input `owner[k]`."""

    features: list[dict]
    owner: list[int]

    def counts(self, num_inputs: int) -> list[int]:
        """Windows per input."""
        counts = [0] * num_inputs
        for i in self.owner:
            counts[i] += 1
        return counts


@dataclass(frozen=True)
class LongText:
    mode: str = TRUNCATE
    stride: int = DEFAULT_STRIDE
    pooling: str = MEAN
    window: int | None = None  # tokens per window, when recorded (else the reader's max_length)

    def __post_init__(self) -> None:
        for name, value, allowed in (("long_text", self.mode, MODES), ("chunk_pooling", self.pooling, POOLINGS)):
            if value not in allowed:
                raise LongTextError(f"{name}: must be one of {', '.join(allowed)} (got {value!r})")
        if isinstance(self.stride, bool) or not isinstance(self.stride, int) or self.stride < 0:
            raise LongTextError(f"chunk_stride: must be a whole number >= 0 (got {self.stride!r})")
        if self.window is not None and (
            isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1
        ):
            raise LongTextError(f"chunk_max_length: must be a whole number >= 1 (got {self.window!r})")

    @property
    def chunked(self) -> bool:
        return self.mode == CHUNK

    @classmethod
    def of(cls, config: Any) -> LongText:
        """What a transformers config records; truncate by default."""
        stride = getattr(config, "chunk_stride", None)
        return cls(
            getattr(config, "long_text", None) or TRUNCATE,
            DEFAULT_STRIDE if stride is None else stride,
            getattr(config, "chunk_pooling", None) or MEAN,
            getattr(config, "chunk_max_length", None),
        )

    def config_fields(self) -> dict[str, Any]:
        return dict(zip(FIELDS, (self.mode, self.stride, self.pooling, self.window)))

    def check(self, tokenizer, max_length: int, pairs: bool = False) -> None:
        """Chunking needs a fast tokenizer and a stride below a window's text tokens; checked before tokenizing."""
        if not self.chunked:
            return
        if not getattr(tokenizer, "is_fast", False):
            raise LongTextError(f"long_text: chunk needs a fast tokenizer ({type(tokenizer).__name__} is not one)")
        room = max_length - tokenizer.num_special_tokens_to_add(pair=pairs)
        if self.stride >= room:
            raise LongTextError(
                f"chunk_stride: must be smaller than a window's {room} text tokens (max_length {max_length} less "
                f"{max_length - room} special tokens; got {self.stride})"
            )

    def encode(
        self, tokenizer, texts: Sequence[str], pairs: Sequence[str] | None, max_length: int, max_windows: int = 0
    ) -> Windows:
        """Every text's windows (chunk) or first window (truncate)."""
        options = {"truncation": True, "max_length": max_length, "return_attention_mask": False}
        if not self.chunked:
            encoded = tokenizer(list(texts), list(pairs) if pairs is not None else None, **options)
            return Windows(_features(encoded, range(len(texts))), list(range(len(texts))))
        self.check(tokenizer, max_length, pairs is not None)
        options.update(stride=self.stride, return_overflowing_tokens=True)
        del options["truncation"]  # _groups says which side is windowed
        per_input: list[list[dict]] = [[] for _ in texts]
        for where, kwargs in _groups(tokenizer, texts, pairs, max_length, self.stride):
            encoded = tokenizer(**kwargs, **options)
            owners = [where[k] for k in encoded["overflow_to_sample_mapping"]]
            for owner, feature in zip(owners, _features(encoded, range(len(owners)))):
                per_input[owner].append(feature)
        if max_windows:
            for windows in per_input:
                if len(windows) > max_windows:
                    raise TooManyWindows(len(windows), max_windows, max_length)
        return Windows(
            [feature for windows in per_input for feature in windows],
            [i for i, windows in enumerate(per_input) for _ in windows],
        )

    def refuse_too_long(self, tokenizer, sequences: Sequence[tuple[str, str | None]], window: int, limit: int) -> None:
        """TooManyWindows for an input whose start alone overflows `limit` windows: a huge document is refused in
        milliseconds. Conservative; `encode` counts exactly."""
        room = window - tokenizer.num_special_tokens_to_add(pair=False)
        capacity = limit * max(room - self.stride, 1) + self.stride
        for text, pair in sequences:
            longer = max(text, pair or "", key=len)
            if len(longer) <= capacity:  # at most one token per character
                continue
            start = longer[: capacity * PREFIX_CHARS_PER_TOKEN]
            if len(tokenizer(start, add_special_tokens=False, return_attention_mask=False)["input_ids"]) > capacity:
                raise TooManyWindows(None, limit, window)

    def pool(self, logits: torch.Tensor, owner: Sequence[int] | torch.Tensor, num_inputs: int) -> torch.Tensor:
        """Each input's logits: the mean or maximum of its windows'."""
        import torch  # lazy: --help must not import torch

        index = torch.as_tensor(owner, dtype=torch.long)
        if len(index) == num_inputs and torch.equal(index, torch.arange(num_inputs)):
            return logits  # one window each, in order: nothing to pool
        pooled = torch.zeros(num_inputs, *logits.shape[1:], dtype=logits.dtype)
        spread = index.view(-1, *[1] * (logits.dim() - 1)).expand_as(logits)
        return pooled.scatter_reduce_(0, spread, logits, "mean" if self.pooling == MEAN else "amax", include_self=False)


def _features(encoded, rows) -> list[dict]:
    names = [name for name in ("input_ids", "token_type_ids") if name in encoded]
    return [{name: encoded[name][k] for name in names} for k in rows]


def _groups(tokenizer, texts: Sequence[str], pairs: Sequence[str] | None, max_length: int, stride: int):
    """(input indices, tokenizer arguments) per tokenizer call."""
    if pairs is None:
        yield list(range(len(texts))), {"text": list(texts), "truncation": True}
        return
    room = max_length - tokenizer.num_special_tokens_to_add(pair=True)
    for side in ("only_first", "only_second"):
        where = [i for i in range(len(texts)) if (len(texts[i]) >= len(pairs[i])) == (side == "only_first")]
        if not where:
            continue
        kept = [pairs[i] if side == "only_first" else texts[i] for i in where]
        for i, length in zip(where, map(len, tokenizer(kept, add_special_tokens=False)["input_ids"])):
            if room - length <= stride:
                raise PairLeavesNoRoom(
                    i,
                    f"the shorter text of a pair takes {length} of a window's {room} text tokens, leaving no more "
                    f"than chunk_stride ({stride}) for the longer one; truncate it, or lower chunk_stride",
                )
        yield (
            where,
            {
                "text": [texts[i] for i in where],
                "text_pair": [pairs[i] for i in where],
                "truncation": side,
            },
        )


def cut_long_pairs(tokenizer, texts: list[str], pairs: list[str], max_length: int, left: bool = False, order=None):
    """(texts, pairs, tokens) with overlong sides cut at a word boundary, so truncation gives the same ids in a fraction
    of the time. `tokens`: side lengths, or None; `order(k, tokens)`: which side of pair k is longer."""
    tokens: list[tuple[int, int] | None] = [None] * len(texts)
    long = [k for k, (text, pair) in enumerate(zip(texts, pairs)) if len(text) + len(pair) > max_length]
    if not getattr(tokenizer, "is_fast", False) or not long:  # shorter pairs are cheap to truncate (and rarely need it)
        return texts, pairs, tokens
    unique = list(dict.fromkeys([texts[k] for k in long] + [pairs[k] for k in long]))  # a query shared by pairs: once
    row = {side: n for n, side in enumerate(unique)}
    sides = tokenizer(unique, add_special_tokens=False, return_offsets_mapping=True, return_attention_mask=False)
    texts, pairs = list(texts), list(pairs)
    for k in long:
        i, j = row[texts[k]], row[pairs[k]]
        tokens[k] = (len(sides["input_ids"][i]), len(sides["input_ids"][j]))
        which = order(k, tokens[k]) if order else None
        texts[k], pairs[k] = _cut_pair(sides, i, j, texts[k], pairs[k], max_length, left, which)
    return texts, pairs, tokens


def _cut_pair(
    sides, i: int, j: int, text: str, pair: str, max_length: int, left: bool, order: int | None = None
) -> tuple[str, str]:
    """`order`: 1 text longer, -1 pair longer, 0 equal."""
    n_i, n_j = len(sides["input_ids"][i]), len(sides["input_ids"][j])
    if n_i <= max_length and n_j <= max_length:
        return text, pair
    order = (n_i > n_j) - (n_i < n_j) if order is None else order
    keep_i, keep_j = min(n_i, max_length), min(n_j, max_length)
    for _ in range(8):  # widen until the longer side stays longer
        k_i, k_j = _boundary(sides, i, keep_i, left), _boundary(sides, j, keep_j, left)
        if (k_i > k_j) - (k_i < k_j) == order:
            return _keep(text, sides, i, k_i, left), _keep(pair, sides, j, k_j, left)
        if order > 0:
            keep_i = k_j + 1
        elif order < 0:
            keep_j = k_i + 1
        else:
            keep_i = keep_j = max(k_i, k_j)
    return text, pair


def _boundary(sides, k: int, keep: int, left: bool) -> int:
    """Tokens kept of side k when cut at the first word boundary keeping `keep`."""
    words, n = sides.word_ids(k), len(sides["input_ids"][k])
    if left:
        for t in range(n - keep, 0, -1):
            if words[t] != words[t - 1]:
                return n - t
        return n
    for t in range(keep, n):
        if words[t] != words[t - 1]:
            return t
    return n


def _keep(text: str, sides, k: int, kept: int, left: bool) -> str:
    """Side k's first (last when `left`) `kept` tokens, cut at a word."""
    offsets, n = sides["offset_mapping"][k], len(sides["input_ids"][k])
    if kept >= n:
        return text
    return text[offsets[n - kept][0] :] if left else text[: offsets[kept][0]]
