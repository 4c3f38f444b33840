"""A training step the GPU does not wait for: no host syncs inside it, static shapes, and compiled (--torch_compile).

- No syncs: transformers' SDPA mask code asks the device whether a batch has any padding (`padding_mask.all()`, a
  blocking device-to-host copy in every forward pass) so that it may skip the mask. `sync_free_sdpa` registers SDPA
  under another name whose mask is always built (the same attention, the same numbers). The loss, the non-finite
  guard and the throughput counters stay on the device (training/loop.py, guards.py, throughput.py); the host reads
  them only on logging and stop-check steps.
- Static shapes: batches are padded to a few fixed widths (--pad_buckets, inference/shapes.py).
- Compiled: the model (forward and backward: one graph per width, enforced: a recompilation past the widths is an
  error, not a silent slowdown) and the optimizer step (a capturable multi-tensor AdamW, which the compiler fuses,
  reading its learning rate from a tensor that the schedule fills in place). Under fp16 the GradScaler steps the
  (fused) optimizer eagerly: it decides on the host whether to skip a step. Evaluation runs the eager module: it is
  not the hot path, and its own shapes would only add graphs.

Importing this module changes nothing; train.py calls it.
"""

from __future__ import annotations

import time

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

from inference import shapes

AUTO, NONE, REDUCE_OVERHEAD = "auto", "none", "reduce-overhead"
AUTO_MIN_STEPS = 1000  # --torch_compile auto: shorter GPU runs would not repay the compilation (docs/launching.md)
SYNC_FREE_SDPA = "sdpa_sync_free"


def resolve(requested: str, device_type: str, total_steps: int) -> str:
    """--torch_compile as torch.compile's mode, or NONE. auto: reduce-overhead on GPU for long runs, else none."""
    if requested != AUTO:
        return requested
    return REDUCE_OVERHEAD if device_type == "cuda" and total_steps >= AUTO_MIN_STEPS else NONE


def bucket_count(requested: int | None, torch_compile: str, device_type: str) -> int:
    """--pad_buckets, else DEFAULT_BUCKETS on GPU and whenever compilation was asked for, else 0 (dynamic widths)."""
    if requested is not None:
        return requested
    return shapes.DEFAULT_BUCKETS if device_type == "cuda" or torch_compile not in (AUTO, NONE) else 0


def _sdpa_mask_always(*args, **kwargs):
    kwargs["allow_is_bidirectional_skip"] = False  # skipping needs the host to read the mask: a sync per forward
    return sdpa_mask(*args, **kwargs)


def sync_free_sdpa() -> str:
    """Register SDPA with an always-built mask under SYNC_FREE_SDPA (idempotent); returns the name."""
    AttentionInterface.register(SYNC_FREE_SDPA, sdpa_attention_forward)
    AttentionMaskInterface.register(SYNC_FREE_SDPA, _sdpa_mask_always)
    return SYNC_FREE_SDPA


def compile_optimizer_step(optimizer: torch.optim.Optimizer, mode: str, device: torch.device) -> None:
    """A capturable multi-tensor AdamW's step, compiled (PyTorch's recipe: one fused kernel per update). Its learning
    rate becomes a tensor on `device` that the schedule fills in place (no recompilation, no stale value in a CUDA
    graph). Call after the schedule is built: its base rates stay Python floats (a tensor base rate would make the
    schedule read the device every step)."""
    for group in optimizer.param_groups:
        group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32, device=device)
    optimizer.step = torch.compile(optimizer.step, mode=mode)


def compile_model(model: torch.nn.Module, mode: str, widths: int) -> torch.nn.Module:
    """The prepared (DDP-wrapped) model, compiled for static shapes: at most one graph per batch width; one more is
    an error (dynamo's recompile limit), so a shape leak cannot silently cost a compilation per step."""
    torch._dynamo.config.recompile_limit = max(widths, 1)
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    return torch.compile(model, mode=mode, dynamic=False)


def eager(model: torch.nn.Module) -> torch.nn.Module:
    """The module under a compiled wrapper (evaluation runs it eagerly), or the model itself."""
    return getattr(model, "_orig_mod", model)


class CompileReport:
    """What compilation cost: graphs compiled and the seconds of the steps that compiled them (first use of a width).
    Called around every step, it also marks each step's start for CUDA graphs (reduce-overhead)."""

    def __init__(self, mode: str):
        self.mode = mode
        self.widths_seen: set[int] = set()
        self.compile_s = 0.0
        self._started = 0.0
        self._width = 0

    def before(self, batch: dict) -> None:
        if self.mode == NONE:
            return
        if self.mode == REDUCE_OVERHEAD:  # a new step for CUDA graph trees: the last step's graph outputs are done
            torch.compiler.cudagraph_mark_step_begin()
        self._width = batch["input_ids"].shape[1]
        self._started = time.perf_counter()

    def after(self) -> None:
        if self.mode != NONE and self._width not in self.widths_seen:
            self.widths_seen.add(self._width)
            self.compile_s += time.perf_counter() - self._started

    def summary(self) -> dict:
        stats = torch._dynamo.utils.counters["stats"]
        return {
            "mode": self.mode,
            "widths": sorted(self.widths_seen),
            "graphs": int(stats.get("unique_graphs", 0)),
            "compile_seconds": round(self.compile_s, 3),
        }
