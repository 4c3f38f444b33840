"""Padding for every model family, one rule for training, evaluation, prediction and the service.

A decoder classifier (Qwen2, Llama, Gemma, Mistral: `*ForSequenceClassification`) scores the last token that is not
padding, which it finds through `config.pad_token_id`; most decoder tokenizers have no pad token at all. Then the
end-of-text token pads (the usual recipe), and the config's `pad_token_id` is set to match, so the model pools the
last real token whichever side the tokenizer pads on.
"""

from __future__ import annotations

from contract.errors import UserError


class NoPadToken(UserError, ValueError):
    """A tokenizer with neither a pad token nor an end-of-text token to pad with."""


def ensure_pad_token(tokenizer, where: str) -> str | None:
    """Give `tokenizer` its end-of-text token as pad token if it has none; a line saying so, for the log (None when
    it had one). Raises NoPadToken when it has neither."""
    if tokenizer.pad_token_id is not None:
        return None
    if tokenizer.eos_token_id is None:
        raise NoPadToken(
            f"{where}: the tokenizer has neither a pad token nor an end-of-text token to pad with; give it one "
            "(tokenizer.pad_token = ...) and save it"
        )
    tokenizer.pad_token = tokenizer.eos_token
    return f"{where}: no pad token; padding with the end-of-text token {tokenizer.eos_token!r}"


def match_pad_token(config, pad_token_id: int) -> None:
    """The model's `pad_token_id`, where its config has none, set to the tokenizer's (a decoder pools the last token
    that is not it)."""
    if getattr(config, "pad_token_id", None) is None:
        config.pad_token_id = pad_token_id
