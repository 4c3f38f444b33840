"""The model call both sides make on a loaded checkpoint: padded features, one forward pass, fp32 logits. Used by the
service's engine, predict, bench/ and the tests.
"""

from __future__ import annotations

import torch

from contract import shapes
from contract.loading import LoadedModel

PAD_MULTIPLE = shapes.GPU_MULTIPLE  # tensor-core friendly widths


def collate(
    features: list[dict], pad_token_id: int, left: bool = False, rows: int | None = None, width: int | None = None
) -> dict[str, torch.Tensor]:
    """Ids, type ids and mask padded to `width`, in `rows` rows (extra rows hold one padding token)."""
    width = width or shapes.width_for(max(len(f["input_ids"]) for f in features), multiple=PAD_MULTIPLE)
    filler = {name: [pad_token_id if name == "input_ids" else 0] for name in features[0]}
    return shapes.pad([*features, *[filler] * ((rows or len(features)) - len(features))], pad_token_id, width, left)


@torch.inference_mode()
def forward(
    loaded: LoadedModel, features: list[dict], rows: int | None = None, width: int | None = None
) -> torch.Tensor:
    """fp32 logits of one forward pass, left on the model's device."""
    tokenizer = loaded.tokenizer
    bucket = getattr(loaded.runner, "bucket", None)  # a captured runner (inference/engine/captured.py): its shapes only
    if bucket is not None and rows is None:
        rows, width = bucket(len(features), max(len(f["input_ids"]) for f in features))
    batch = collate(features, tokenizer.pad_token_id, tokenizer.padding_side == "left", rows, width)
    if loaded.runner is not None:
        logits = loaded.runner(batch)
    elif loaded.device.type == "cuda":  # pinned, so the copy does not block the host
        logits = loaded.model(
            **{k: v.pin_memory().to(loaded.device, non_blocking=True) for k, v in batch.items()}
        ).logits
    else:
        logits = loaded.model(**batch).logits
    return logits[: len(features)].float()
