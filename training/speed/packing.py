"""Packed batches (--packing): a batch's texts end to end in one row, padded only to a bucket, so no layer works on
padding. Called by batching and the model set-up.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from contract import shapes
from contract.attention import sync_free_mask

PACKED = "sdpa_packed"
STARTS, TEXT_MASK = "cu_seq_lens_q", "packed_text_mask"  # batch keys the model's attention reads (transformers' name)
MODEL_TYPES = ("distilbert",)  # they read the encoder's first token


def supported(model: torch.nn.Module) -> bool:
    return getattr(model.config, "model_type", None) in MODEL_TYPES


def pack(
    features: Sequence[dict], pad_token_id: int, widths: tuple[int, ...], multiple: int, longest: int | None = None
) -> dict:
    """The texts in one row with restarting positions, padded to a width; STARTS and TEXT_MASK describe the texts."""
    lengths = np.fromiter((len(f["input_ids"]) for f in features), dtype=np.int64, count=len(features))
    total = int(lengths.sum())
    width = shapes.width_for(total, widths, multiple)
    ids = np.full((1, width), pad_token_id, dtype=np.int64)
    ids[0, :total] = np.concatenate([np.asarray(f["input_ids"], dtype=np.int64) for f in features])
    positions = np.zeros((1, width), dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    positions[0, :total] = np.arange(total) - np.repeat(starts[:-1], lengths)
    longest = longest or shapes.width_for(int(lengths.max()), (), multiple)
    text_mask = np.arange(longest)[None, :] < lengths[:, None]
    return {
        "input_ids": torch.from_numpy(ids),
        "position_ids": torch.from_numpy(positions),
        STARTS: torch.from_numpy(starts.astype(np.int32)),
        TEXT_MASK: torch.from_numpy(text_mask),
    }


def real_tokens(batch: dict) -> torch.Tensor:
    """Text tokens of a packed batch."""
    return batch[STARTS][-1]


def register() -> str:
    """Register PACKED with transformers (idempotent); returns the name for attn_implementation."""
    AttentionInterface.register(PACKED, _attention)
    AttentionMaskInterface.register(PACKED, _mask)
    return PACKED


def _mask(*args, **kwargs):
    """No mask when packed; the sync-free SDPA mask otherwise."""
    if kwargs.get("attention_mask") is None:
        return None
    return sync_free_mask(*args, **kwargs)


def _attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' attention interface, packed."""
    starts = kwargs.get(STARTS)
    if starts is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    kernel = KERNELS.get(query.device.type, gathered_attention)
    return kernel(query[0], key[0], value[0], starts, kwargs[TEXT_MASK], scaling), None


def varlen_attention(q, k, v, starts, text_mask, scaling) -> torch.Tensor:
    """Flash attention over the texts of a row ([heads, tokens, dim] each); the padding after the last text is 0."""
    from torch.nn.attention.varlen import varlen_attn

    longest = text_mask.shape[1]
    # The kernel neither writes the padding's output rows nor their gradients (dq, dk, dv): left as allocated, NaN at
    # times, they reach every weight's gradient through the layers around attention (NaN x 0 is NaN). A select, not
    # a product, so that NaN there becomes 0 both ways.
    text = (torch.arange(q.shape[1], device=q.device) < starts[-1])[:, None, None]
    q, k, v = (torch.where(text, t.transpose(0, 1), 0) for t in (q, k, v))  # [tokens, heads, dim]
    out = varlen_attn(q, k, v, starts, starts, longest, longest, scale=scaling)
    return torch.where(text, out, 0).unsqueeze(0)


def gathered_attention(q, k, v, starts, text_mask, scaling) -> torch.Tensor:
    """Attention per text without varlen kernels: gathered into padded blocks, SDPA, scattered back; no syncs."""
    heads, tokens, dim = q.shape
    slots = starts[:-1, None].long() + torch.arange(text_mask.shape[1], device=q.device)  # [texts, longest]
    spare = torch.full_like(slots, tokens)
    where = torch.where(text_mask, slots, spare)
    blocks = [torch.cat([t, t.new_zeros(heads, 1, dim)], 1)[:, where].transpose(0, 1) for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*blocks, attn_mask=text_mask[:, None, None, :], scale=scaling)
    packed = out.new_zeros(tokens + 1, heads, dim)
    packed = packed.index_put((where.reshape(-1),), out.permute(0, 2, 1, 3).reshape(-1, heads, dim))
    return packed[:tokens].unsqueeze(0)


KERNELS = {"cuda": varlen_attention}  # per device type; any other: gathered_attention


def hand_first_tokens(model: torch.nn.Module) -> None:
    """The head reads each packed text's first token."""
    encoder = next(m for m in model.modules() if type(m).__name__ == "DistilBertModel")

    def first_tokens(module, args, kwargs, output):
        starts = kwargs.get(STARTS)
        if starts is not None:
            output["last_hidden_state"] = output["last_hidden_state"][0, starts[:-1].long()].unsqueeze(1)
        return output

    encoder.register_forward_hook(first_tokens, with_kwargs=True)
