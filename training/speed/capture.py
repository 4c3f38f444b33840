"""A training step the GPU does not wait for (--torch_compile): no host syncs, static shapes, compiled or captured.
Called by set_up.py, train.py and the loop; docs/launching.md tells the modes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accelerate import Accelerator, DistributedType

from contract.attention import SYNC_FREE_SDPA
from training.config import ConfigError
from training.speed import cpu_speed, step_graph

if TYPE_CHECKING:
    from training.config import TrainConfig


import logging
import time

import torch

from contract import shapes

logger = logging.getLogger(__name__)

AUTO, NONE, REDUCE_OVERHEAD = "auto", "none", "reduce-overhead"
WHOLE_STEP = "whole-step"  # compiled model, step captured by step_graph.py
# uses of one width before its steps only replay graphs (graph trees run once, record next; the optimizer step adds one)
RECORDING_USES = 3
AUTO_MIN_STEPS = 1000  # shorter runs do not repay compiling


def resolve(
    requested: str,
    pad_buckets: int | None,
    device_type: str,
    total_steps: int,
    processes: int = 1,
    mixed_precision: str = "no",
    distributed: bool = False,
) -> str:
    """--torch_compile resolved: auto compiles long one-GPU runs with fixed widths, never several GPUs."""
    multi_gpu = device_type == "cuda" and processes > 1
    if requested == WHOLE_STEP:
        why = whole_step_refusal(mixed_precision, distributed or processes > 1)
        if why is None:
            return requested
        logger.warning("--torch_compile whole-step %s: reduce-overhead instead", why)
        requested = REDUCE_OVERHEAD
    if requested != AUTO:
        if multi_gpu and requested != NONE:
            logger.warning(
                "--torch_compile %s on %d GPUs: a compiled step under DDP or FSDP with CUDA graphs is unproven here "
                "(no multi-GPU machine has run it); --torch_compile none is the tested path",
                requested,
                processes,
            )
        return requested
    long_gpu_run = device_type == "cuda" and total_steps >= AUTO_MIN_STEPS and not multi_gpu
    return REDUCE_OVERHEAD if long_gpu_run and pad_buckets != 0 else NONE


def whole_step_refusal(mixed_precision: str, distributed: bool) -> str | None:
    """Why a whole-step graph cannot hold this step, or None."""
    if mixed_precision == "fp16":
        return "under fp16 (the GradScaler decides on the host whether to step)"
    if distributed:
        return "under DDP or FSDP (their hooks run between the backward pass and the step)"
    return None


def bucket_count(requested: int | None, mode: str, device_type: str) -> int:
    """--pad_buckets, else fixed widths only for a compiled step (more on CPU), else 0."""
    if requested is not None:
        return requested
    if mode == NONE:
        return 0
    return shapes.DEFAULT_BUCKETS if device_type == "cuda" else shapes.CPU_COMPILED_BUCKETS


def steps_compiled(mode: str, mixed_precision: str) -> bool:
    """The optimizer step is compiled: when compiling, except fp16 and whole-step."""
    return mode not in (NONE, WHOLE_STEP) and mixed_precision != "fp16"


def tensor_learning_rate(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Learning rates as device tensors the schedule fills: no recompiles, no stale graph values."""
    for group in optimizer.param_groups:
        group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32, device=device)


def compile_optimizer_step(optimizer: torch.optim.Optimizer, mode: str, device: torch.device, max_norm: float) -> None:
    """AdamW's step compiled with the clipping before it, reading tensor rates."""
    tensor_learning_rate(optimizer, device)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    step = optimizer.step

    def clip_and_step(closure=None):
        if max_norm > 0:  # the same norm on every rank
            torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
        return step(closure)

    optimizer.step = torch.compile(clip_and_step, mode=mode)


def compile_model(model: torch.nn.Module, mode: str, widths: int) -> torch.nn.Module:
    """The model compiled for static shapes; a recompile is an error, not a silent cost."""
    torch._dynamo.config.recompile_limit = max(widths, 1)
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    return torch.compile(model, mode=mode, dynamic=False)


def compiled_model(model: torch.nn.Module, mode: str, widths: int, device_type: str) -> torch.nn.Module:
    """The model as `mode` runs it."""
    if mode == NONE or (mode == WHOLE_STEP and device_type != "cuda"):
        return model
    return compile_model(model, "default" if mode == WHOLE_STEP else mode, widths)


def eager(model: torch.nn.Module) -> torch.nn.Module:
    """The module under a compiled wrapper."""
    return getattr(model, "_orig_mod", model)


def grads_outside_graphs(model: torch.nn.Module) -> None:
    """Give every trainable parameter a zeroed .grad of its own, for accumulation under CUDA graphs."""
    for param in model.parameters():
        if param.requires_grad and param.grad is None:
            param.grad = torch.zeros_like(param)


class CompiledSteps:
    """The run's compiled steps: mode, marks, steadiness and compile cost."""

    def __init__(self, mode: str, clips_in_step: bool = False, accumulation: int = 1):
        self.mode = mode
        self.clips_in_step = clips_in_step  # the compiled optimizer step clips the gradients (compile_optimizer_step)
        # under graphs with accumulation, .grad is zeroed in place, never None
        self.grads_to_none = not (mode == REDUCE_OVERHEAD and accumulation > 1)
        self.uses: dict[int, int] = {}  # steps run per batch width
        self.compile_s = 0.0
        self.record_s = 0.0
        self.steady = True  # the last step neither compiled nor recorded
        self._started = 0.0
        self._width = 0

    def begin_step(self, batch: dict) -> bool:
        """Mark a new CUDA-graph-trees step; whether it is steady."""
        if self.mode == NONE:
            return True
        if self.mode == REDUCE_OVERHEAD:  # the last step's outputs are done
            torch.compiler.cudagraph_mark_step_begin()
        self._width = batch["input_ids"].shape[1]
        self._started = time.perf_counter()
        warming_uses = RECORDING_USES if self.mode == REDUCE_OVERHEAD else 1
        self.steady = self.uses.get(self._width, 0) >= warming_uses
        return self.steady

    def end_step(self) -> None:
        if self.mode == NONE:
            return
        uses = self.uses[self._width] = self.uses.get(self._width, 0) + 1
        if uses == 1:
            self.compile_s += time.perf_counter() - self._started
        elif not self.steady:
            self.record_s += time.perf_counter() - self._started

    def summary(self) -> dict:
        stats = torch._dynamo.utils.counters["stats"]
        return {
            "mode": self.mode,
            "widths": sorted(self.uses),
            "graphs": int(stats.get("unique_graphs", 0)),
            "compile_seconds": round(self.compile_s, 3),
            "record_seconds": round(self.record_s, 3),  # recording syncs: host time is wall time
        }


def for_run(cfg: TrainConfig, accelerator: Accelerator, total_steps: int) -> str:
    """--torch_compile for this run."""
    device, world = accelerator.device, accelerator.num_processes
    distributed = accelerator.distributed_type != DistributedType.NO
    # compiled steps run AdamW only (config.py refuses another with a compile mode): `auto` compiles nothing for it
    requested = cfg.torch_compile if cfg.optim == "adamw" else NONE
    precision = accelerator.mixed_precision
    mode = resolve(requested, cfg.pad_buckets, device.type, total_steps, world, precision, distributed)
    if mode == WHOLE_STEP and not step_graph.available(device):
        raise ConfigError(f"torch_compile: whole-step captures CUDA graphs, which a {device.type} device has not")
    attention = cpu_speed.attention_for(cfg.attn_implementation, cfg.fast_dropout, device)
    if mode == WHOLE_STEP and attention != SYNC_FREE_SDPA:
        raise ConfigError(
            f"torch_compile: whole-step needs --attn_implementation sdpa ({attention} attention asks the device "
            "whether a batch has padding, which a CUDA graph capture cannot do)"
        )
    return mode
