"""CPU training speed-ups, switched on explicitly by the run's set-up: attention, dropout, threads. Importing changes
nothing. Measurements: docs/benchmarks.md.
"""

from __future__ import annotations

import logging
import os

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

from contract.attention import sync_free_sdpa
from contract.cpu import busy_share, free_cores

CPU_TRAINING_ATTENTION = "eager_fast_dropout"
logger = logging.getLogger(__name__)


def choose_threads(local_processes: int) -> None:
    """Intra-op threads for a CPU run: the cores shared among local processes, less those others keep busy (spinning
    OpenMP threads cost more than fewer threads)."""
    if "OMP_NUM_THREADS" in os.environ:
        return
    default = torch.get_num_threads()
    busy = busy_share()
    threads = min(default // max(local_processes, 1), free_cores(default, busy)) or 1
    if threads != default:
        torch.set_num_threads(threads)
    logger.info(
        "CPU threads: %d of %d (%d local process(es), %.0f %% of the cores busy with other programs; "
        "OMP_NUM_THREADS sets it)",
        threads,
        default,
        local_processes,
        100 * busy,
    )


def keep_saved_threads(saved: dict, current: dict) -> None:
    """A resumed CPU run keeps its saved thread count (sums split by threads), unless OMP_NUM_THREADS says otherwise."""
    threads = saved.get("cpu_threads")
    if threads is None or "cpu_threads" not in current or current["cpu_threads"] == threads:
        return
    if "OMP_NUM_THREADS" in os.environ:
        return  # the layout check names the change
    torch.set_num_threads(threads)
    current["cpu_threads"] = threads
    logger.info("CPU threads: %d, as the resumed state was saved with (a bitwise resume)", threads)


def fast_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """Dropout drawing four keep decisions per 64-bit random number; the same expectation, torch's generator (exact
    resume)."""
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
    """Swap nn.Dropout for FastDropout; how many. CPU only."""
    swapped = 0
    for parent in model.modules():
        for name, child in parent.named_children():
            if type(child) is torch.nn.Dropout:
                setattr(parent, name, FastDropout(child.p).train(child.training))
                swapped += 1
    return swapped


def eager_attention_with_fast_dropout(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager attention with FastDropout on the probabilities; grouped-query heads shared as transformers shares them."""
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
    """The requested attention, else sdpa on GPU and eager on CPU."""
    if requested == "sdpa" or (not requested and device.type != "cpu"):
        return sync_free_sdpa()
    if requested:
        return requested
    return register_attention() if fast_dropout_on else "eager"


def enable(model: torch.nn.Module, fast_dropout_on: bool, device: torch.device) -> int:
    """FastDropout on CPU when asked; how many."""
    return use_fast_dropout(model) if fast_dropout_on and device.type == "cpu" else 0
