"""A smaller student from its teacher's own layers, as DistilBERT was made from BERT: the embeddings, the chosen layers
and the head copied into a shallower model of the same family. Called by `agnews distill --student_layers`.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from contract import files
from contract.agreement import FIELD
from contract.errors import UsageError
from contract.loading import load_model

logger = logging.getLogger(__name__)


def chosen_layers(spec: str, total: int) -> list[int]:
    """`0,2,4` as written, or a count spread evenly from the first layer to the last."""
    try:
        values = [int(part) for part in spec.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"student_layers: {spec!r} is neither a count nor layer numbers such as 0,2,4") from None
    if len(values) == 1 and "," not in spec:
        count = values[0]
        if not 1 <= count < total:
            raise UsageError(f"student_layers: {count} layers; the teacher has {total}, so between 1 and {total - 1}")
        values = [round(i * (total - 1) / max(count - 1, 1)) for i in range(count)] if count > 1 else [0]
    if not values or any(not 0 <= v < total for v in values) or sorted(set(values)) != values:
        raise UsageError(f"student_layers: {spec!r}: layer numbers rising, each from 0 to {total - 1} (the teacher's)")
    return values


def layer_list(model: torch.nn.Module, total: int) -> tuple[torch.nn.Module, str]:
    """The module holding the `total` transformer layers, and its attribute name there."""
    for module in model.modules():
        for name, child in module.named_children():
            if isinstance(child, torch.nn.ModuleList) and len(child) == total:
                return module, name
    raise UsageError(f"student_layers: no list of {total} layers found in {type(model).__name__}")


def smaller_copy(teacher: Path, spec: str, out: Path) -> list[int]:
    """The student's folder at `out` (weights, config, the teacher's tokenizer as it reads texts): the layers kept.
    The teacher is read by the service's own loader: safetensors or a state_dict, never a pickle that runs code."""
    loaded = load_model(str(teacher), device="cpu", dtype="fp32")
    model, total = loaded.model, loaded.model.config.num_hidden_layers
    kept = chosen_layers(spec, total)
    holder, name = layer_list(model, total)
    layers = torch.nn.ModuleList([getattr(holder, name)[i] for i in kept])
    for new, layer in enumerate(layers):
        for module in layer.modules():  # a decoder's attention knows its place (its cache slot)
            if isinstance(getattr(module, "layer_idx", None), int):
                module.layer_idx = new
    setattr(holder, name, layers)
    model.config.num_hidden_layers = len(kept)
    if isinstance(getattr(model.config, "layer_types", None), list):  # Qwen3's, Gemma's: one entry per layer
        model.config.layer_types = [model.config.layer_types[i] for i in kept]
    setattr(model.config, FIELD, {"teacher": str(teacher), "layers": kept})
    model.save_pretrained(out)
    loaded.tokenizer.save_pretrained(out / files.TOKENIZER_DIR)
    logger.info("Student: layers %s of the teacher's %d (embeddings and head copied)", kept, total)
    return kept
