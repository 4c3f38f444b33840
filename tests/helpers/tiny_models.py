"""Tiny random configs of the architectures users bring (decoder LLMs, long-context encoders), built offline: speed
and shapes, not quality, so a test can train, save and serve one in seconds."""

from __future__ import annotations

from transformers import AutoConfig, PretrainedConfig


def tiny_config(model_type: str, vocab_size: int, **fields) -> PretrainedConfig:
    """`model_type`'s config at 2 layers of width 32 (64 in the feed-forward), 4 query heads sharing 2 key/value
    heads where the architecture has grouped-query attention; `fields` override or add."""
    sizes = dict(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    heads = {"num_attention_heads": 2} if model_type == "modernbert" else {"num_attention_heads": 4}
    if model_type != "modernbert":
        heads["num_key_value_heads"] = 2
    return AutoConfig.for_model(model_type, **{**sizes, **heads, **fields})
