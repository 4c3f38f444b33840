"""CUDA graphs for serving: each (batch, width) bucket's forward pass captured once, at warm-up, then replayed.

A replay launches the whole forward pass in one call. It needs static shapes (contract/shapes.py `serving_buckets`),
no host syncs inside (contract/attention.py) and fixed input and output tensors per bucket. The graphs share one
memory pool, captured largest first: about the largest bucket's activations on top of the weights. Called by the
engine at start-up and on each reload.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

import torch

from contract import graphs
from contract.attention import sync_free_sdpa

logger = logging.getLogger(__name__)
WARM_UP_PASSES = 2  # eager passes on a side stream before capturing: lazy initialisation must not be captured


class GraphsUnsupported(ValueError):
    """The model cannot run the sync-free attention a capture needs (an architecture without SDPA)."""


def available(device: torch.device) -> bool:
    """Whether forward passes on `device` can be captured: CUDA graphs exist on CUDA only."""
    return device.type == "cuda"


class CudaGraphs:
    """The CUDA side of capturing, kept apart from the host-side logic of `CapturedForward` (buckets, static inputs,
    copies) so the CPU suite can run that logic through a stand-in for this class (tests/helpers/cuda_graphs):
    one memory pool, eager warm-up passes on a side stream, the capture, and pinned staging for the copies in."""

    def __init__(self, device: torch.device):
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        self._copied = torch.cuda.Event(blocking=True)  # a wait on it sleeps; .cpu() would spin a core

    def capture(self, run: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
        """(replay, the tensor `run` returned while captured: each replay rewrites it) after WARM_UP_PASSES passes."""
        return graphs.capture(run, self.device, self.pool, WARM_UP_PASSES)

    @staticmethod
    def staged(values: torch.Tensor) -> torch.Tensor:
        return values.pin_memory()  # pinned: the copy to the device does not block the host

    def to_host(self, values: torch.Tensor) -> torch.Tensor:
        """fp32 `values` on the host: copied without blocking into pinned memory, then waited for on an event that
        lets this thread sleep until the GPU is done. A plain .cpu() spins its core for the whole forward pass,
        beside the event loop and every other worker process of the machine."""
        host = torch.empty(values.shape, dtype=torch.float32, pin_memory=True)
        host.copy_(values.to(torch.float32), non_blocking=True)
        self._copied.record()
        self._copied.synchronize()
        return host

    def reserved_mib(self) -> float:
        torch.cuda.synchronize(self.device)
        return torch.cuda.memory_reserved(self.device) / 2**20


class CapturedForward:
    """batch -> fp32 logits on the host, like `LoadedModel.runner`, replaying the graph captured for the batch's
    shape; a shape that was not captured is a KeyError (the engine pads every pass to a captured one: `bucket`)."""

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
        """The bucket's replay, with the input tensors a replay reads and the logits it writes."""
        fill = {"input_ids": pad_token_id, "attention_mask": 1, "token_type_ids": 0}
        inputs = {name: torch.full((rows, width), fill[name], dtype=torch.long, device=self.device) for name in names}
        replay, logits = self._cuda.capture(lambda: model(**inputs).logits)
        return replay, inputs, logits

    def bucket(self, rows: int, longest: int) -> tuple[int, int]:
        """The smallest captured (rows, width) that holds `rows` inputs of at most `longest` tokens: a forward pass
        that was not planned in buckets (warm-up, a single text) is padded to it."""
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
    """What the engine's batches hold: the tokenizer's model inputs (DistilBERT's have no token type ids, BERT's
    have) and always the attention mask."""
    return {*tokenizer.model_input_names, "attention_mask"}
