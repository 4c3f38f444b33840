"""A training step the GPU does not wait for (--torch_compile): no host syncs, static shapes, compiled.

The model runs sync-free SDPA (contract/attention.py); the loss, the non-finite guard and the throughput counters stay
on the device. Batches are padded to a few fixed widths (contract/shapes.py). The model (one graph per width; a
recompilation past them is an error) and the optimizer step with its clipping (a capturable AdamW reading a tensor
learning rate) are compiled; under fp16 the GradScaler steps eagerly. Evaluation runs the eager module.
Importing this module changes nothing; train.py calls it.
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
WHOLE_STEP = "whole-step"  # the model compiled without graphs, the whole step captured by training/speed/step_graph.py
# Steps of one width before its steps only replay CUDA graphs: CUDA graph trees run a new graph once unrecorded
# (the first use, which also compiles it) and record it at the next; one more use for the compiled optimizer step,
# which runs only on optimizer steps (under accumulation, every other use or fewer).
RECORDING_USES = 3
AUTO_MIN_STEPS = 1000  # --torch_compile auto: shorter GPU runs would not repay the compilation (docs/launching.md)


def resolve(
    requested: str,
    pad_buckets: int | None,
    device_type: str,
    total_steps: int,
    processes: int = 1,
    mixed_precision: str = "no",
    distributed: bool = False,
) -> str:
    """--torch_compile as torch.compile's mode, WHOLE_STEP, or NONE. auto: reduce-overhead on one GPU for long runs,
    else none; never with --pad_buckets 0 (dynamic widths: every new width would recompile, past the enforced limit),
    and never on several GPUs: a compiled, captured step under DDP (or FSDP) has not run on any machine here (none has
    two GPUs), so it is only taken when asked for, with a warning. whole-step needs one unsharded process and no
    GradScaler (fp16); elsewhere it is reduce-overhead, said in a warning."""
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
    """Why a whole-step graph cannot hold this run's step, or None."""
    if mixed_precision == "fp16":
        return "under fp16 (the GradScaler decides on the host whether to step)"
    if distributed:
        return "under DDP or FSDP (their hooks run between the backward pass and the step)"
    return None


def bucket_count(requested: int | None, mode: str, device_type: str) -> int:
    """--pad_buckets, else fixed widths only where a compiled step needs them (`mode`, resolved): DEFAULT_BUCKETS on
    GPU, CPU_COMPILED_BUCKETS on a CPU (a padded token costs a CPU as much as a real one, and launches are cheap
    there: more, narrower widths); uncompiled, 0: dynamic widths (rounded up to 8 on GPU), the least padding."""
    if requested is not None:
        return requested
    if mode == NONE:
        return 0
    return shapes.DEFAULT_BUCKETS if device_type == "cuda" else shapes.CPU_COMPILED_BUCKETS


def steps_compiled(mode: str, mixed_precision: str) -> bool:
    """Whether the optimizer step (and the clipping before it) is compiled: with compilation on, except under fp16
    and in a whole-step graph (which captures it uncompiled)."""
    return mode not in (NONE, WHOLE_STEP) and mixed_precision != "fp16"


def tensor_learning_rate(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Each group's learning rate as a tensor on `device` that the schedule fills in place: a compiled or captured
    step reads it there (no recompilation, no stale value in a CUDA graph). Call after the schedule is built: its
    base rates stay Python floats (a tensor base rate would make the schedule read the device every step)."""
    for group in optimizer.param_groups:
        group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32, device=device)


def compile_optimizer_step(optimizer: torch.optim.Optimizer, mode: str, device: torch.device, max_norm: float) -> None:
    """A capturable multi-tensor AdamW's step, compiled with the gradient clipping to `max_norm` before it (0: none)
    in one graph (PyTorch's recipe: fused kernels per update, no eager norm), reading a tensor learning rate
    (`tensor_learning_rate`). The loop then clips no more (`CompiledSteps.clips_in_step`)."""
    tensor_learning_rate(optimizer, device)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    step = optimizer.step

    def clip_and_step(closure=None):
        if max_norm > 0:  # every rank holds the all-reduced gradients here: the same norm everywhere
            torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
        return step(closure)

    optimizer.step = torch.compile(clip_and_step, mode=mode)


def compile_model(model: torch.nn.Module, mode: str, widths: int) -> torch.nn.Module:
    """The prepared (DDP-wrapped) model, compiled for static shapes: at most one graph per batch width; one more is
    an error (dynamo's recompile limit), so a shape leak cannot silently cost a compilation per step."""
    torch._dynamo.config.recompile_limit = max(widths, 1)
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    return torch.compile(model, mode=mode, dynamic=False)


def compiled_model(model: torch.nn.Module, mode: str, widths: int, device_type: str) -> torch.nn.Module:
    """The model as `mode` runs it: compiled for a torch.compile mode; for a whole-step graph compiled without graphs
    of its own on CUDA (elsewhere graphs exist only as the CPU suite's stand-in, which replays the eager model)."""
    if mode == NONE or (mode == WHOLE_STEP and device_type != "cuda"):
        return model
    return compile_model(model, "default" if mode == WHOLE_STEP else mode, widths)


def eager(model: torch.nn.Module) -> torch.nn.Module:
    """The module under a compiled wrapper (evaluation runs it eagerly), or the model itself."""
    return getattr(model, "_orig_mod", model)


def grads_outside_graphs(model: torch.nn.Module) -> None:
    """Give every trainable parameter a zeroed .grad of its own, for gradient accumulation under CUDA graphs.

    A captured backward writes its gradients into the graph pool, and autograd adopts them as .grad when .grad is
    None; the next micro-step's mark (`CompiledSteps.begin_step`) lets the next replay overwrite them, so accumulating
    into them would read overwritten memory (PyTorch: "accessing gradient tensor output of CUDAGraphs that has been
    overwritten"). With .grad allocated here, outside any capture, each backward adds into it instead, and the
    loop zeroes it in place (`CompiledSteps.grads_to_none` False) rather than dropping it."""
    for param in model.parameters():
        if param.requires_grad and param.grad is None:
            param.grad = torch.zeros_like(param)


class CompiledSteps:
    """The run's compiled steps: the mode, each step's mark for CUDA graph trees, whether the step is steady (neither
    compiling nor recording; every eager step is), and what compilation cost (graphs compiled, the seconds of the
    steps that compiled or recorded them)."""

    def __init__(self, mode: str, clips_in_step: bool = False, accumulation: int = 1):
        self.mode = mode
        self.clips_in_step = clips_in_step  # the compiled optimizer step clips the gradients (compile_optimizer_step)
        # under CUDA graphs with accumulation, .grad lives outside the graph pool (grads_outside_graphs): zeroed in
        # place after each optimizer step, never set to None (the next backward would adopt pool memory again)
        self.grads_to_none = not (mode == REDUCE_OVERHEAD and accumulation > 1)
        self.uses: dict[int, int] = {}  # steps run per batch width
        self.compile_s = 0.0
        self.record_s = 0.0
        self.steady = True  # the last step neither compiled nor recorded
        self._started = 0.0
        self._width = 0

    def begin_step(self, batch: dict) -> bool:
        """Mark a new step for CUDA graph trees (reduce-overhead: the last step's graph outputs may be overwritten
        now; a correctness mark, not a report) and say whether this step is steady (see the class)."""
        if self.mode == NONE:
            return True
        if self.mode == REDUCE_OVERHEAD:  # a new step for CUDA graph trees: the last step's graph outputs are done
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
            "record_seconds": round(self.record_s, 3),  # host time: recording syncs, so it is close to wall time
        }


def for_run(cfg: TrainConfig, accelerator: Accelerator, total_steps: int) -> str:
    """--torch_compile for this run; whole-step only where CUDA graphs exist and attention never syncs."""
    device, world = accelerator.device, accelerator.num_processes
    distributed = accelerator.distributed_type != DistributedType.NO
    mode = resolve(
        cfg.torch_compile, cfg.pad_buckets, device.type, total_steps, world, accelerator.mixed_precision, distributed
    )
    if mode == WHOLE_STEP and not step_graph.available(device):
        raise ConfigError(f"torch_compile: whole-step captures CUDA graphs, which a {device.type} device has not")
    attention = cpu_speed.attention_for(cfg.attn_implementation, cfg.fast_dropout, device)
    if mode == WHOLE_STEP and attention != SYNC_FREE_SDPA:
        raise ConfigError(
            f"torch_compile: whole-step needs --attn_implementation sdpa ({attention} attention asks the device "
            "whether a batch has padding, which a CUDA graph capture cannot do)"
        )
    return mode
