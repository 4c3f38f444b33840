"""Attention that never asks the device a question: SDPA whose mask is always built.

transformers' SDPA mask code asks the device whether a batch has any padding (`padding_mask.all()`, a blocking
device-to-host copy in every forward pass) so that it may skip the mask. A forward pass with that copy in it can be
neither captured as a CUDA graph nor overlapped with the host's next step. `sync_free_sdpa` registers SDPA under
another name whose mask is always built: the same attention, the same numbers, no sync. Training (speed/capture.py)
and serving (inference/graphs.py) use it alike.
"""

from __future__ import annotations

from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

SYNC_FREE_SDPA = "sdpa_sync_free"


def sync_free_mask(*args, **kwargs):
    kwargs["allow_is_bidirectional_skip"] = False  # skipping needs the host to read the mask: a sync per forward
    return sdpa_mask(*args, **kwargs)


def sync_free_sdpa() -> str:
    """Register SDPA with an always-built mask under SYNC_FREE_SDPA (idempotent); returns the name, which
    `attn_implementation` (or `model.set_attn_implementation`) accepts."""
    AttentionInterface.register(SYNC_FREE_SDPA, sdpa_attention_forward)
    AttentionMaskInterface.register(SYNC_FREE_SDPA, sync_free_mask)
    return SYNC_FREE_SDPA
