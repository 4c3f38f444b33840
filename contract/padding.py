"""Padding for every model family: one rule for training, evaluation, prediction and the service.

A decoder classifier pools its last non-padding token, found through `pad_token_id`. Without a pad token, the
end-of-text token pads and the config is set to match.
"""

from __future__ import annotations

from contract.errors import UserError


class NoPadToken(UserError, ValueError):
    """Neither a pad token nor an end-of-text token."""


def ensure_pad_token(tokenizer, where: str) -> str | None:
    """Give `tokenizer` its end-of-text token as pad token; a log line, or None."""
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
    """Set the config's missing pad_token_id to the tokenizer's."""
    if getattr(config, "pad_token_id", None) is None:
        config.pad_token_id = pad_token_id
