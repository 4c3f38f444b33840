"""CUDA graphs for serving: each (rows, width) bucket's forward pass captured at warm-up, then replayed. Called by the
engine; tests/helpers/cuda_graphs stands in for the CUDA part on CPUs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

import torch

from contract import graphs
from contract.attention import sync_free_sdpa

logger = logging.getLogger(__name__)
WARM_UP_PASSES = 2  # lazy initialisation must not be captured


class GraphsUnsupported(ValueError):
    """An architecture without the sync-free SDPA a capture needs."""


def available(device: torch.device) -> bool:
    """CUDA graphs exist on CUDA only."""
    return device.type == "cuda"


class CudaGraphs:
    """The CUDA side of capturing: memory pool, warm-up, capture, pinned staging. Kept apart so the CPU suite can swap
    it."""

    def __init__(self, device: torch.device):
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        self._copied = torch.cuda.Event(blocking=True)  # a wait on it sleeps; .cpu() would spin a core

    def capture(self, run: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
        """(replay, the output tensor each replay rewrites)."""
        return graphs.capture(run, self.device, self.pool, WARM_UP_PASSES)

    @staticmethod
    def staged(values: torch.Tensor) -> torch.Tensor:
        return values.pin_memory()  # pinned: the copy does not block the host

    def to_host(self, values: torch.Tensor) -> torch.Tensor:
        """fp32 `values` to pinned host memory, waited for on an event: .cpu() would spin a core."""
        host = torch.empty(values.shape, dtype=torch.float32, pin_memory=True)
        host.copy_(values.to(torch.float32), non_blocking=True)
        self._copied.record()
        self._copied.synchronize()
        return host

    def reserved_mib(self) -> float:
        torch.cuda.synchronize(self.device)
        return torch.cuda.memory_reserved(self.device) / 2**20


class CapturedForward:
    """batch -> fp32 host logits by replaying the batch shape's graph; an uncaptured shape is a KeyError."""

    def __init__(self, model: torch.nn.Module, buckets: Iterable[tuple[int, int]], tokenizer):
        self.device = next(model.parameters()).device
        try:
            model.set_attn_implementation(sync_free_sdpa())
        except ValueError as exc:  # transformers: this architecture does not support SDPA
            raise GraphsUnsupported(f"{type(model).__name__} cannot run SDPA attention: {exc}") from None
        self._cuda = CudaGraphs(self.device)
        self._graphs: dict[tuple[int, int], tuple[Callable[[], None], dict[str, torch.Tensor], torch.Tensor]] = {}
        names = [name for name in ("input_ids", "attention_mask", "token_type_ids") if name in _inputs(tokenizer)]
        started = time.perf_counter()
        for rows, width in sorted(buckets, key=lambda b: b[0] * b[1], reverse=True):  # the largest sizes the pool
            self._graphs[rows, width] = self._capture(model, rows, width, tokenizer.pad_token_id, names)
        logger.info(
            "Captured %d CUDA graphs (one per batch shape) in %.1f s; GPU memory reserved: %.0f MiB",
            len(self._graphs),
            time.perf_counter() - started,
            self._cuda.reserved_mib(),
        )

    @torch.inference_mode()
    def _capture(self, model, rows: int, width: int, pad_token_id: int, names: list[str]):
        """The bucket's replay, inputs and logits."""
        fill = {"input_ids": pad_token_id, "attention_mask": 1, "token_type_ids": 0}
        inputs = {name: torch.full((rows, width), fill[name], dtype=torch.long, device=self.device) for name in names}
        replay, logits = self._cuda.capture(lambda: model(**inputs).logits)
        return replay, inputs, logits

    def bucket(self, rows: int, longest: int) -> tuple[int, int]:
        """The smallest captured (rows, width) holding the inputs."""
        fits = [shape for shape in self._graphs if shape[0] >= rows and shape[1] >= longest]
        if not fits:
            raise ValueError(f"no captured batch shape holds {rows} inputs of {longest} tokens")
        return min(fits, key=lambda shape: (shape[0] * shape[1], shape))

    @torch.inference_mode()
    def __call__(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        replay, inputs, logits = self._graphs[tuple(batch["input_ids"].shape)]
        for name, values in batch.items():
            inputs[name].copy_(self._cuda.staged(values), non_blocking=True)
        replay()
        return self._cuda.to_host(logits)  # a copy: the next replay overwrites `logits`


def _inputs(tokenizer) -> set[str]:
    """The model inputs the tokenizer gives, plus the attention mask."""
    return {*tokenizer.model_input_names, "attention_mask"}
