"""The classifier as the exporters see it: the tokenizer's tensors in, logits out, no cache. Used by the OpenVINO and
ONNX Runtime builds.
"""

from __future__ import annotations

import inspect

import torch


class LogitsOnly(torch.nn.Module):
    """`model` with logits as its one output; a decoder's key-value cache left off (a tracer cannot return it)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self.options = {"use_cache": False} if "use_cache" in inspect.signature(model.forward).parameters else {}

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        pair = {} if token_type_ids is None else {"token_type_ids": token_type_ids}  # a BERT's; DistilBERT has none
        return self.model(input_ids=input_ids, attention_mask=attention_mask, **pair, **self.options).logits
