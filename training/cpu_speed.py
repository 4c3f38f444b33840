"""CPU training speed-ups, in one place and switched on explicitly: the run's set-up calls `attention_for`
(which registers the CPU attention with transformers when it picks it) and `enable` on CPU. Importing this
module changes nothing. Measurements behind the choices: docs/benchmarks.md.

- FastDropout: nn.Dropout with one 64-bit random draw per four elements (16 bits each).
- eager attention with FastDropout on the attention probabilities: on CPU, eager attention trains faster
  than SDPA (PyTorch's CPU flash-attention backward is slow), and its largest dropout tensor gets cheap.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

from contract.attention import sync_free_sdpa

CPU_TRAINING_ATTENTION = "eager_fast_dropout"


def fast_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """Dropout whose keep/drop decisions come four to a 64-bit random draw. The keep probability equals
    1 - p to within 2^-16 and outputs are scaled by its exact inverse, so the expected value is unchanged.
    Uses torch's default generator: seeded by set_seed, saved and restored with the resumable state."""
    threshold = int(round(p * 65536)) - 32768  # keep where the 16-bit draw >= threshold
    n = x.numel()
    words = torch.randint(-(2**63), 2**63 - 1, ((n + 3) // 4,), dtype=torch.int64, device=x.device)
    keep = words.view(torch.int16)[:n].view(x.shape) >= threshold
    return x * keep * (65536 / (32768 - threshold))  # 1 / exact keep probability


class FastDropout(torch.nn.Module):
    """nn.Dropout through fast_dropout, for CPU training (see use_fast_dropout)."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        return fast_dropout(x, self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def use_fast_dropout(model: torch.nn.Module) -> int:
    """Swap every nn.Dropout module for FastDropout (same p); returns how many. CPU only: CUDA's own is fused."""
    swapped = 0
    for parent in model.modules():
        for name, child in parent.named_children():
            if type(child) is torch.nn.Dropout:
                setattr(parent, name, FastDropout(child.p).train(child.training))
                swapped += 1
    return swapped


def eager_attention_with_fast_dropout(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """softmax(QK^T * scale + mask) V, the attention-probability dropout done by FastDropout. Grouped-query
    attention (fewer key/value heads than query heads: Llama, Qwen2, Gemma...) shares each key/value head among its
    group of query heads, as transformers' eager attention does; a logit soft cap (Gemma 2) is applied likewise."""
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, key.transpose(2, 3)) * (scaling if scaling is not None else query.size(-1) ** -0.5)
    if kwargs.get("softcap"):
        scores = torch.tanh(scores / kwargs["softcap"]) * kwargs["softcap"]
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, :, : key.shape[-2]]
    probs = torch.nn.functional.softmax(scores, dim=-1)
    if module.training and dropout:
        probs = fast_dropout(probs, dropout)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


def register_attention() -> str:
    """Make CPU_TRAINING_ATTENTION a name transformers' `attn_implementation` accepts (idempotent)."""
    AttentionInterface.register(CPU_TRAINING_ATTENTION, eager_attention_with_fast_dropout)
    AttentionMaskInterface.register(CPU_TRAINING_ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS["eager"])  # eager's masks
    return CPU_TRAINING_ATTENTION


def attention_for(requested: str | None, fast_dropout_on: bool, device: torch.device) -> str:
    """The requested attention (sdpa or eager, --attn_implementation), else sdpa on GPU and on CPU eager (with
    FastDropout unless it is off). SDPA is the sync-free registration of contract/attention.py."""
    if requested == "sdpa" or (not requested and device.type != "cpu"):
        return sync_free_sdpa()
    if requested:
        return requested
    return register_attention() if fast_dropout_on else "eager"


def enable(model: torch.nn.Module, fast_dropout_on: bool, device: torch.device) -> int:
    """Switch the model's dropout modules to FastDropout on CPU when asked; returns how many were swapped."""
    return use_fast_dropout(model) if fast_dropout_on and device.type == "cpu" else 0
