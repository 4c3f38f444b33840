"""The whole training step as one CUDA graph per batch shape (--torch_compile whole-step): one replay per step. Called
by the loop; tests/helpers/cuda_graphs stands in on CPUs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from contract import graphs

WARM_UP_PASSES = 1  # lazy initialisation must not be captured


def available(device: torch.device) -> bool:
    return device.type == "cuda"


class CudaGraphs:
    """Capture on CUDA into one shared pool: graphs run one at a time."""

    def __init__(self, device: torch.device):
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()

    def capture(self, step: Callable[[], None]) -> Callable[[], None]:
        return graphs.capture(step, self.device, self.pool, WARM_UP_PASSES)[0]


class StepGraph:
    """The run's captured steps, captured lazily. `step()` returns a loss the next replay overwrites."""

    def __init__(self, model, optimizer, max_grad_norm: float, accumulation: int, guard, device: torch.device):
        self.model, self.guard = model, guard  # guard: training/guards.py StopGuard, observing each loss in the graph
        self.optimizer = getattr(optimizer, "optimizer", optimizer)  # the AdamW itself: no host logic in a capture
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.max_grad_norm, self.accumulation = max_grad_norm, accumulation
        self.graphs = CudaGraphs(device)
        self.loss = torch.zeros((), device=device)  # outside the pool: no later capture can reuse its memory
        self.inputs: dict[tuple, dict[str, torch.Tensor]] = {}  # the static batch of each shape
        self.replays: dict[tuple, Callable[[], None]] = {}
        for param in self.params:  # allocated here, outside every graph: each backward adds into them
            param.grad = torch.zeros_like(param)

    @property
    def captured(self) -> int:
        return len(self.replays)

    def step(self, batch: dict, sync: bool, forward: Callable[[dict], torch.Tensor]) -> torch.Tensor:
        shape = tuple((key, *value.shape) for key, value in batch.items() if isinstance(value, torch.Tensor))
        static = self.inputs.get(shape)
        if static is None:
            static = self.inputs[shape] = {k: v.clone() for k, v in batch.items() if isinstance(v, torch.Tensor)}
        else:
            for key, value in static.items():
                value.copy_(batch[key], non_blocking=True)
        one_graph = sync and self.accumulation == 1  # the update inside the shape's own graph
        key = (shape, one_graph)
        if key not in self.replays:
            self.replays[key] = self._capture(lambda: self._micro_step(static, forward, update=one_graph))
        self.replays[key]()
        if sync and not one_graph:
            if "update" not in self.replays:
                self.replays["update"] = self._capture(self._update)
            self.replays["update"]()
        return self.loss

    def _micro_step(self, static: dict, forward: Callable[[dict], torch.Tensor], update: bool) -> None:
        loss = forward(static)
        # as accelerator.backward: the window's mean, not its sum
        (loss / self.accumulation if self.accumulation > 1 else loss).backward()
        self.loss.copy_(loss.detach())
        self.guard.observe(self.loss)
        if update:
            self._update()

    def _update(self) -> None:
        if self.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm, foreach=True)
        self.optimizer.step()
        torch._foreach_zero_([p.grad for p in self.params])

    def _capture(self, step: Callable[[], None]) -> Callable[[], None]:
        """Capture `step`, undoing its warm-up passes."""
        with _preserved(self._state()):
            return self.graphs.capture(step)

    def _state(self) -> list[torch.Tensor]:
        """Every tensor a step writes, allocated first."""
        _initial_state(self.optimizer)
        state = [t for values in self.optimizer.state.values() for t in values.values() if isinstance(t, torch.Tensor)]
        written = [*self.model.parameters(), *self.model.buffers(), *(p.grad for p in self.params), *state]
        return [*written, self.loss, *self.guard.counters]


def _initial_state(optimizer: torch.optim.Optimizer) -> None:
    """AdamW's state, created as its first step would."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            if optimizer.state.get(param):
                continue
            optimizer.state[param] = {
                "step": torch.zeros((), dtype=torch.float32, device=param.device),
                "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format),
                **({"max_exp_avg_sq": torch.zeros_like(param)} if group.get("amsgrad") else {}),
            }


@contextmanager
def _preserved(tensors: list[torch.Tensor]) -> Iterator[None]:
    """Restore `tensors` in place, and the generators."""
    saved = [t.detach().clone() for t in tensors]
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        with torch.no_grad():
            torch._foreach_copy_([t.detach() for t in tensors], saved)
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
