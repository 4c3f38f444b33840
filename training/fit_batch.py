"""--auto_find_batch_size: the largest per-device batch whose training pass fits in memory, found before the first
step with accelerate's find_executable_batch_size, and gradient accumulation raised to keep the effective batch.
Called by set_up.py.
"""

from __future__ import annotations

import logging

import torch
from accelerate import Accelerator
from accelerate.utils import find_executable_batch_size

from contract.errors import UserError
from training.config import TrainConfig

logger = logging.getLogger(__name__)
ADAM_STATES = 2  # AdamW keeps two float32 tensors per trainable weight, allocated at the first step


def fit_batch(cfg: TrainConfig, accelerator: Accelerator, model: torch.nn.Module) -> TrainConfig:
    """`cfg` with the largest divisor of the asked batch whose forward and backward pass at --max_length fits, beside
    room for the optimizer's states; the same on every process (the smallest any found)."""
    asked = cfg.per_device_train_batch_size
    sizes = [size for size in range(asked, 0, -1) if asked % size == 0]  # divisors: the effective batch stays exact
    tried: list[int] = []

    def halved() -> int:
        return next((size for size in sizes if size <= tried[-1] // 2), 0)

    @find_executable_batch_size(starting_batch_size=asked, reduce_batch_size_fn=halved)
    def probe(rows: int) -> int:
        tried.append(rows)
        _training_pass(model, rows, cfg.max_length, accelerator)
        return rows

    model.to(accelerator.device)
    try:
        found = probe()
    except RuntimeError as exc:  # accelerate's words once the batch reached zero
        raise UserError(
            f"--auto_find_batch_size: not even 1 example of {cfg.max_length} tokens fits in memory for training "
            f"({exc}); lower --max_length, or use --gradient_checkpointing or LoRA (--lora_r)"
        ) from None
    found = int(accelerator.gather(torch.tensor([found], device=accelerator.device)).min())
    if found == asked:
        logger.info("--auto_find_batch_size: %d examples of %d tokens per device fit", asked, cfg.max_length)
        return cfg
    accumulation = cfg.gradient_accumulation_steps * asked // found
    logger.warning(
        "--auto_find_batch_size: %d examples of %d tokens per device did not fit (tried %s); %d per device x %d "
        "accumulation steps keeps the effective batch",
        asked,
        cfg.max_length,
        ", ".join(map(str, tried)),
        found,
        accumulation,
    )
    accelerator.gradient_accumulation_steps = accumulation
    return cfg.model_copy(update={"per_device_train_batch_size": found, "gradient_accumulation_steps": accumulation})


def _training_pass(model: torch.nn.Module, rows: int, width: int, accelerator: Accelerator) -> None:
    """A forward and backward pass of `rows` x `width` tokens while tensors the size of the optimizer's states are
    held; every gradient and tensor freed after."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    held = [torch.empty_like(p, dtype=torch.float32) for p in trainable for _ in range(ADAM_STATES)]
    ids = torch.ones(rows, width, dtype=torch.long, device=accelerator.device)
    try:
        with accelerator.autocast():
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        logits.float().sum().backward()
    finally:
        model.zero_grad(set_to_none=True)
        del held
