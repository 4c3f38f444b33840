"""CUDA graphs on the CPU: the host-side rules of the two GPU-only mechanisms, so the CPU suite runs the code that
only a GPU would otherwise run (and a rare GPU lease measures instead of debugging). The package knows nothing of
this module: tests install it in-process (`install_serving`, `install_training`) or through this folder's
sitecustomize.py for every process of a real run (tests/conftest.py: `graphs_env`).

Serving (inference/engine/captured.py): `CpuGraphs` stands in for `CudaGraphs`, the CUDA primitive under
`CapturedForward`.
A capture runs the warm-up passes, then records the forward pass on its static input tensors; a replay re-runs it
on the same tensors and writes into the same output tensor, as a replayed graph does. Everything above it is the
real code: buckets, the static inputs filled by copies, the copy out, a KeyError for a shape that was not captured.

Training (torch.compile(mode="reduce-overhead"), CUDA graph trees): the outputs of a compiled model, and every .grad
that autograd adopted from its backward (.grad was None before), live in the graph pool, and
`torch.compiler.cudagraph_mark_step_begin()` lets the next replay overwrite them. Here the mark overwrites them
with NaN: whatever reads one after the next mark (gradient accumulation into an adopted .grad, a loss read late)
computes NaN, as on CUDA it reads overwritten memory or raises. .grad that are views (DDP's buckets) are not the
pool's and are left alone.

Whole-step training graphs (speed/step_graph.py): `CpuStepGraphs` stands in for its `CudaGraphs`. A capture runs
the warm-up passes, then the step once under a guard that raises on any host-device sync (CUDA refuses one inside a
capture); a replay re-runs the step on the same static tensors. What the stand-in cannot show: Python that a replay
would skip (a replay re-runs it here).

Capturable optimizer: `on_parameters_device` is the rule a capturable AdamW enforces on CUDA (its step counts and
tensor learning rate beside the parameters); `tests/training` checks it with parameters on the meta device as the
"GPU", since on a CPU every tensor is beside every other.
"""

from __future__ import annotations

import importlib
import math
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

WARM_UP_PASSES = 2
REPORT = "cuda-graphs stand-in: graph outputs held in the pool"  # sitecustomize.py prints it at exit, with counts
STEP_REPORT = "cuda-graphs stand-in: whole steps captured"  # likewise


class CpuGraphs:
    """`inference.engine.captured.CudaGraphs` on the CPU: capture records on static tensors, replay re-runs them."""

    captures = 0  # across instances: how many forward passes were captured (tests read it)

    def __init__(self, device: torch.device):
        self.device = device

    def capture(self, run):
        for _ in range(WARM_UP_PASSES):
            run()
        output = run()
        CpuGraphs.captures += 1

        def replay() -> None:
            output.copy_(run())  # the captured pass, on the captured input tensors, into the captured output

        return replay, output

    @staticmethod
    def staged(values: torch.Tensor) -> torch.Tensor:
        return values  # no pinned memory without CUDA; the copy itself is the real code's

    @staticmethod
    def to_host(values: torch.Tensor) -> torch.Tensor:
        return values.to(torch.float32, copy=True)  # a new tensor, as the pinned host copy is: replays cannot touch it

    def reserved_mib(self) -> float:
        return 0.0


class SyncDuringCapture(RuntimeError):
    """A capture read a device value on the host (CUDA: 'operation not permitted when stream is capturing')."""


class _NoSyncs(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default):
            raise SyncDuringCapture(f"{func} inside a captured step")
        return func(*args, **(kwargs or {}))


class CpuStepGraphs:
    """`training.speed.step_graph.CudaGraphs` on the CPU: capture = warm up, then run once with syncs refused; replay =
    re-run on the same static tensors."""

    captures = 0  # across instances (tests read it)

    def __init__(self, device: torch.device):
        self.device = device

    def capture(self, step):
        for _ in range(importlib.import_module("training.speed.step_graph").WARM_UP_PASSES):
            step()
        with _NoSyncs():
            step()
        CpuStepGraphs.captures += 1
        return step


def install_step_graphs(patch=None) -> None:
    """Whole-step training graphs on the CPU: `patch` a pytest monkeypatch (undone after the test), else for good."""
    module = importlib.import_module("training.speed.step_graph")  # also while it is being imported (sitecustomize.py)
    setter = patch.setattr if patch is not None else setattr
    setter(module, "CudaGraphs", CpuStepGraphs)
    setter(module, "available", lambda device: True)


def install_serving(patch=None) -> None:
    """Serve through CUDA graphs on the CPU: `patch` a pytest monkeypatch (undone after the test), else for good."""
    module = importlib.import_module("inference.engine.captured")  # also while it is being imported (sitecustomize.py)
    setter = patch.setattr if patch is not None else setattr
    setter(module, "CudaGraphs", CpuGraphs)
    setter(module, "available", lambda device: True)


class GraphPool:
    """The step rule of CUDA graph trees: what the current step's replays produced, overwritten at the next mark."""

    def __init__(self):
        self._outputs: list[weakref.ref] = []
        self._grad_was_none: set[int] = set()
        self.held = 0  # graph outputs that entered the pool (the stand-in ran)
        self.overwritten = 0  # of them, still referenced when a mark overwrote them (a reader may follow)

    def hold(self, value) -> None:
        for tensor in _tensors(value):
            if tensor.is_floating_point():
                self._outputs.append(weakref.ref(tensor))
                self.held += 1

    def mark_step_begin(self) -> None:
        for ref in self._outputs:
            tensor = ref()
            if tensor is not None:
                with torch.no_grad():
                    tensor.detach().fill_(math.nan)
                self.overwritten += 1
        self._outputs.clear()

    def watch(self, compiled: torch.nn.Module) -> torch.nn.Module:
        """`compiled` (a reduce-overhead module) with its outputs and the .grad its backward hands over in the pool."""
        params = [p for p in compiled.parameters() if p.requires_grad]

        def before_forward(module, args, kwargs):
            self._grad_was_none = {id(p) for p in params if p.grad is None}

        def after_forward(module, args, kwargs, output):
            self.hold(output)

        def after_accumulate(param):
            if id(param) in self._grad_was_none and param.grad is not None and param.grad._base is None:
                self.hold(param.grad)  # adopted from the backward's output: pool memory

        compiled.register_forward_pre_hook(before_forward, with_kwargs=True)
        compiled.register_forward_hook(after_forward, with_kwargs=True)
        for param in params:
            param.register_post_accumulate_grad_hook(after_accumulate)
        return compiled


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):  # transformers' ModelOutput is a dict
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)


def install_training() -> GraphPool:
    """torch.compile(mode="reduce-overhead") with the step rule of CUDA graph trees, for this process."""
    pool = GraphPool()
    compile_ = torch.compile

    def compile_with_pool(target=None, **options):
        compiled = compile_(target, **options)
        if options.get("mode") == "reduce-overhead" and isinstance(compiled, torch.nn.Module):
            pool.watch(compiled)
        return compiled

    torch.compile = compile_with_pool
    torch.compiler.cudagraph_mark_step_begin = pool.mark_step_begin
    return pool


def on_parameters_device(optimizer: torch.optim.Optimizer) -> list[str]:
    """What a capturable optimizer would refuse on CUDA: each tensor learning rate and state tensor not on its
    parameters' device (empty when all is well)."""
    inner = getattr(optimizer, "optimizer", optimizer)
    wrong = []
    for g, group in enumerate(inner.param_groups):
        device = group["params"][0].device
        if isinstance(group["lr"], torch.Tensor) and group["lr"].device != device:
            wrong.append(f"group {g} lr on {group['lr'].device}")
        for param in group["params"]:
            for name, value in inner.state.get(param, {}).items():
                if isinstance(value, torch.Tensor) and value.device != param.device:
                    wrong.append(f"group {g} {name} on {value.device}")
    return wrong
