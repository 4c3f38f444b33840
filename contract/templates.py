"""The prompt template a decoder classifier reads its inputs through (--template; `prompt_template` in config.json): a
prefix, the text, for pairs a middle and the second text, and a suffix, where the label tokens are read. Set as the
tokenizer's post-processor, so every encoding (training, evaluate, predict, the service's front-ends, the runtimes,
tokenizer.json read by other servers) wraps the text alike, and truncation and long-text windows cut the text, never
the template: the suffix is always the last tokens of every window. Called by training/model.py and the loader.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tokenizers import processors

from contract.errors import UserError

CONFIG_FIELD = "prompt_template"
TEXT, PAIR = "{text}", "{text_pair}"
ALIASES = {"{query}": TEXT, "{document}": PAIR}  # a reranker's words for the two sides
PARTS = ("prefix", "middle", "suffix")  # the template's own tokens, as the post-processor's "special" tokens


class TemplateError(UserError, ValueError):
    """A template that cannot wrap the model's inputs."""


@dataclass(frozen=True)
class Template:
    """`prefix{text}suffix`, or `prefix{text}middle{text_pair}suffix` for pairs."""

    source: str
    prefix: str
    middle: str
    suffix: str
    pairs: bool

    @classmethod
    def parse(cls, source: str) -> Template:
        """The template a string names; TemplateError without the text's place, or with a place twice."""
        text = source
        for alias, name in ALIASES.items():
            text = text.replace(alias, name)
        places = re.findall(r"\{text(?:_pair)?\}", text)
        if places not in ([TEXT], [TEXT, PAIR]):
            raise TemplateError(
                f"template {source!r:.120}: needs {TEXT} (or {{query}}) once, then optionally {PAIR} (or "
                f"{{document}}) once after it, e.g. 'Topic of: {TEXT}\\nAnswer:'"
            )
        prefix, rest = text.split(TEXT)
        middle, suffix = rest.split(PAIR) if PAIR in rest else ("", rest)
        return cls(source, prefix, middle, suffix, PAIR in rest)

    def token_ids(self, tokenizer) -> dict[str, list[int]]:
        """Each part's ids, tokenized alone (as Qwen3-Reranker's own usage builds its prefix and suffix)."""
        return {part: tokenizer.encode(getattr(self, part), add_special_tokens=False) for part in PARTS}

    def apply(self, tokenizer) -> None:
        """Make the template `tokenizer`'s post-processor (a fast tokenizer's): the model's own special tokens give
        way to it, a byte-level tokenizer keeps its offsets' processor."""
        ids = self.token_ids(tokenizer)
        tokens = {part: tokenizer.convert_ids_to_tokens(found) for part, found in ids.items()}
        named = {part.upper(): part for part in PARTS if ids[part]}  # an empty part is left out

        def pattern(*pieces: str) -> str:
            return " ".join(piece for piece in pieces if piece.startswith("$") or piece in named)

        single, pair = pattern("PREFIX", "$A", "SUFFIX"), pattern("PREFIX", "$A", "MIDDLE", "$B", "SUFFIX")
        special = [{"id": name, "ids": ids[part], "tokens": tokens[part]} for name, part in named.items()]
        wrap = processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)
        backend = tokenizer.backend_tokenizer
        kept = backend.post_processor
        offsets = isinstance(kept, processors.ByteLevel)
        backend.post_processor = processors.Sequence([kept, wrap]) if offsets else wrap

    def length(self, tokenizer, pair: bool = False) -> int:
        """The tokens the template adds to a text (or a pair)."""
        ids = self.token_ids(tokenizer)
        return len(ids["prefix"]) + len(ids["suffix"]) + (len(ids["middle"]) if pair else 0)

    def check(self, tokenizer, max_length: int) -> None:
        """TemplateError when the template leaves a window no room for the text."""
        used = self.length(tokenizer, pair=self.pairs)
        if used >= max_length:
            raise TemplateError(
                f"template {self.source!r:.80}: its own {used} tokens leave no room for the text in the model's "
                f"{max_length}-token window; shorten it or raise --max_length"
            )


def template_of(config) -> Template | None:
    """The template config.json records, or None."""
    source = getattr(config, CONFIG_FIELD, None)
    if source is None:
        return None
    if not isinstance(source, str):
        raise TemplateError(f"config.json: {CONFIG_FIELD} must be a string (got {source!r:.80})")
    return Template.parse(source)
