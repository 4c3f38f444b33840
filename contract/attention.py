"""Attention that never asks the device a question: SDPA whose mask is always built.

transformers' SDPA skips an all-ones mask by reading it on the host: a sync that blocks graph capture. Training and
serving use this instead.
"""

from __future__ import annotations

from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

SYNC_FREE_SDPA = "sdpa_sync_free"


def sync_free_mask(*args, **kwargs):
    kwargs["allow_is_bidirectional_skip"] = False  # skipping reads the mask on the host: a sync
    return sdpa_mask(*args, **kwargs)


def sync_free_sdpa() -> str:
    """Register the always-masked SDPA; returns its `attn_implementation` name."""
    AttentionInterface.register(SYNC_FREE_SDPA, sdpa_attention_forward)
    AttentionMaskInterface.register(SYNC_FREE_SDPA, sync_free_mask)
    return SYNC_FREE_SDPA
