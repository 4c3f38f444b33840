"""CUDA graphs for serving: each (batch, width) bucket's forward pass captured once, at warm-up, then replayed.

A replay launches the whole forward pass (hundreds of kernels) in one call, so a micro-batch costs the host a copy
in, one launch and a copy out, instead of the Python and launch time of every layer. What it needs:
- static shapes: the engine pads every forward pass to one of the buckets (inference/shapes.py: `serving_buckets`);
- no host syncs inside the forward pass: the model runs attention whose mask is always built
  (inference/attention.py), so nothing asks the device whether a batch has padding;
- fixed input and output tensors per bucket: a replay reads the inputs copied into them, writes the same output.
The graphs share one memory pool, captured largest first, so they cost about the activations of the largest bucket
on top of the weights (docs/serving.md: workers on a GPU). Capture happens once per loaded model (start-up and each
reload), and the log says how long it took.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

import torch

from inference.attention import sync_free_sdpa

logger = logging.getLogger(__name__)
WARM_UP_PASSES = 2  # eager passes on a side stream before capturing: lazy initialisation must not be captured


class GraphsUnsupported(ValueError):
    """The model cannot run the sync-free attention a capture needs (an architecture without SDPA)."""


class CapturedForward:
    """batch -> fp32 logits, like `LoadedModel.runner`, replaying the graph captured for the batch's shape."""

    def __init__(self, model: torch.nn.Module, buckets: Iterable[tuple[int, int]], tokenizer):
        self.device = next(model.parameters()).device
        try:
            model.set_attn_implementation(sync_free_sdpa())
        except ValueError as exc:  # transformers: this architecture does not support SDPA
            raise GraphsUnsupported(f"{type(model).__name__} cannot run SDPA attention: {exc}") from None
        self._pool = torch.cuda.graph_pool_handle()
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, dict[str, torch.Tensor], torch.Tensor]] = {}
        names = [name for name in ("input_ids", "attention_mask", "token_type_ids") if name in _inputs(tokenizer)]
        started = time.perf_counter()
        for rows, width in sorted(buckets, key=lambda b: b[0] * b[1], reverse=True):  # the largest sizes the pool
            self._graphs[rows, width] = self._capture(model, rows, width, tokenizer.pad_token_id, names)
        torch.cuda.synchronize(self.device)
        logger.info(
            "Captured %d CUDA graphs (one per batch shape) in %.1f s; GPU memory reserved: %.0f MiB",
            len(self._graphs),
            time.perf_counter() - started,
            torch.cuda.memory_reserved(self.device) / 2**20,
        )

    @torch.inference_mode()
    def _capture(self, model, rows: int, width: int, pad_token_id: int, names: list[str]):
        """The bucket's graph, with the input tensors a replay reads and the logits it writes."""
        fill = {"input_ids": pad_token_id, "attention_mask": 1, "token_type_ids": 0}
        inputs = {name: torch.full((rows, width), fill[name], dtype=torch.long, device=self.device) for name in names}
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(WARM_UP_PASSES):
                model(**inputs)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):  # a reload captures while
            # the model thread still replays the old model's graphs
            logits = model(**inputs).logits
        return graph, inputs, logits

    def bucket(self, rows: int, longest: int) -> tuple[int, int]:
        """The smallest captured (rows, width) that holds `rows` inputs of at most `longest` tokens: a forward pass
        that was not planned in buckets (warm-up, a single text) is padded to it."""
        fits = [shape for shape in self._graphs if shape[0] >= rows and shape[1] >= longest]
        if not fits:
            raise ValueError(f"no captured batch shape holds {rows} inputs of {longest} tokens")
        return min(fits, key=lambda shape: (shape[0] * shape[1], shape))

    @torch.inference_mode()
    def __call__(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        graph, inputs, logits = self._graphs[tuple(batch["input_ids"].shape)]
        for name, values in batch.items():
            inputs[name].copy_(values.pin_memory(), non_blocking=True)
        graph.replay()
        return logits.to(torch.float32, copy=True)  # a copy: the next replay overwrites `logits`


def _inputs(tokenizer) -> set[str]:
    """What the engine's batches hold: the tokenizer's model inputs (DistilBERT's have no token type ids, BERT's
    have) and always the attention mask."""
    return {*tokenizer.model_input_names, "attention_mask"}
