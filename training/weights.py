"""The model's weights out and back in: the one path every edit of a trained model takes (restoring the best model,
folding a temperature into the output layer), whatever wraps it: a single process, DDP, FSDP2 (whose parameters are
shards: an edit of an unsharded view is lost at the next save), a compiled module. train.py and checkpoint.py call it
on every rank."""

from __future__ import annotations

from collections.abc import Callable

import torch
from accelerate import Accelerator
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict


def edit_weights(accelerator: Accelerator, model: torch.nn.Module, edit: Callable[[dict[str, torch.Tensor]], None]):
    """The full state dict gathered on the main process (on the CPU), `edit` applied to it there, then loaded back
    into every rank's model (sharded again under FSDP). Call on all ranks."""
    unwrapped = accelerator.unwrap_model(model, keep_torch_compile=False)
    weights = get_model_state_dict(unwrapped, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if weights:  # the main process's; the other ranks get an empty dict and the main process's values
        edit(weights)
    spread = StateDictOptions(full_state_dict=True, broadcast_from_rank0=accelerator.num_processes > 1)
    set_model_state_dict(unwrapped, weights, options=spread)
