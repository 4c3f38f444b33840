"""CPU training speed-ups, in one place and switched on explicitly: the run's set-up calls `attention_for`
(which registers the CPU attention with transformers when it picks it) and `enable` on CPU. Importing this
module changes nothing. Measurements behind the choices: docs/benchmarks.md.

- FastDropout: nn.Dropout with one 64-bit random draw per four elements (16 bits each).
- eager attention with FastDropout on the attention probabilities: on CPU, eager attention trains faster
  than SDPA (PyTorch's CPU flash-attention backward is slow), and its largest dropout tensor gets cheap.
"""

from __future__ import annotations

import logging
import os
import time

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

from contract.attention import sync_free_sdpa

CPU_TRAINING_ATTENTION = "eager_fast_dropout"
LOAD_SAMPLE_S = 0.25  # how long the other programs' use of the cores is sampled before choosing the threads
logger = logging.getLogger(__name__)


def choose_threads(local_processes: int) -> None:
    """Torch's intra-op threads for a CPU run, unless the user chose (OMP_NUM_THREADS): torch's default (the
    physical cores) shared among the local processes, less the share of the cores other programs keep busy now.
    OpenMP threads that wait on a busy core spin: beside one busy process on 2 cores, 2 threads trained the smoke
    preset 3x slower than 1 (docs/benchmarks-log.md, "CPU threads"). On an idle machine this is torch's default."""
    if "OMP_NUM_THREADS" in os.environ:
        return
    default = torch.get_num_threads()
    busy = busy_share()
    threads = max(1, min(default // max(local_processes, 1), round(default * (1 - busy))))
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
    """A CPU run resumed with the intra-op threads its state was saved with (they decide how kernels split their
    sums: another count is not bitwise), unless the user chose them (OMP_NUM_THREADS): `current` then says so."""
    threads = saved.get("cpu_threads")
    if threads is None or "cpu_threads" not in current or current["cpu_threads"] == threads:
        return
    if "OMP_NUM_THREADS" in os.environ:
        return  # the layout check names the change
    torch.set_num_threads(threads)
    current["cpu_threads"] = threads
    logger.info("CPU threads: %d, as the resumed state was saved with (a bitwise resume)", threads)


def busy_share() -> float:
    """The share of this process's cores that other programs kept busy over LOAD_SAMPLE_S (Linux /proc/stat; 0
    where it cannot be read). This process sleeps meanwhile, so its own use does not count."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    before = _cpu_times(allowed)
    time.sleep(LOAD_SAMPLE_S)
    after = _cpu_times(allowed)
    if not before or not after:
        return 0.0
    busy = [1 - (a[0] - b[0]) / max(a[1] - b[1], 1) for (a, b) in zip(after.values(), before.values())]
    return min(max(sum(busy) / len(busy), 0.0), 1.0)


def _cpu_times(allowed: set[int] | None) -> dict[int, tuple[int, int]]:
    """{cpu: (idle ticks, all ticks)} from /proc/stat, for the cpus in `allowed` (all when None); {} if unreadable."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            lines = [line.split() for line in fh if line.startswith("cpu") and line[3].isdigit()]
    except OSError:
        return {}
    times = {}
    for fields in lines:
        cpu, ticks = int(fields[0][3:]), [int(v) for v in fields[1:]]
        if allowed is None or cpu in allowed:
            times[cpu] = (ticks[3] + (ticks[4] if len(ticks) > 4 else 0), sum(ticks[:8]))  # idle + iowait; all
    return times


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
