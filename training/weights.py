"""The model's weights out and back in: the one path every edit of a trained model takes, whatever wraps it (one
process, DDP, FSDP2). Called by output/folder.py and finish.py.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from accelerate import Accelerator, DistributedType
from accelerate.logging import get_logger
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

logger = get_logger(__name__)  # the main process says it


def edit_weights(accelerator: Accelerator, model: torch.nn.Module, edit: Callable[[dict[str, torch.Tensor]], None]):
    """The full state dict on the main process, `edit` applied, loaded back on every rank."""
    unwrapped = accelerator.unwrap_model(model, keep_torch_compile=False)
    weights = get_model_state_dict(unwrapped, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if weights:  # others get an empty dict
        edit(weights)
    spread = StateDictOptions(full_state_dict=True, broadcast_from_rank0=accelerator.num_processes > 1)
    set_model_state_dict(unwrapped, weights, options=spread)


def ddp_buffers(accelerator: Accelerator, model: torch.nn.Module) -> None:
    """DDP's buffer broadcast, only where a forward pass changes buffers."""
    handler = accelerator.ddp_handler
    if accelerator.distributed_type == DistributedType.FSDP:  # DDP's settings do not apply: say what shards
        plugin = accelerator.state.fsdp_plugin
        logger.info(
            "FSDP%d: parameters, gradients and optimizer state sharded over %d processes (%s wrapping); states "
            "saved as %s",
            plugin.fsdp_version,
            accelerator.num_processes,
            plugin.auto_wrap_policy.__name__ if callable(plugin.auto_wrap_policy) else plugin.auto_wrap_policy,
            plugin.state_dict_type.name if hasattr(plugin.state_dict_type, "name") else plugin.state_dict_type,
        )
        return
    if handler is None or accelerator.num_processes == 1:
        return
    handler.broadcast_buffers = any(getattr(m, "track_running_stats", False) for m in model.modules())
    logger.info(
        "DDP: gradients as views of the all-reduce buckets, %s, buffers %s",
        "static graph" if handler.static_graph else "graph found each step",
        "broadcast every step" if handler.broadcast_buffers else "not broadcast (none changes)",
    )
