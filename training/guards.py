"""Starting and stopping safely: a launch whose processes form no group is refused; preemption and divergence are
decided by all ranks together. Called by train.py, set_up.py and the loop.
"""

from __future__ import annotations

import os
import signal

import torch
from accelerate import Accelerator

from contract.errors import UsageError


class StopGuard:
    def __init__(self, accelerator: Accelerator, max_nonfinite_steps: int):
        self.accelerator = accelerator
        self.max_nonfinite_steps = max_nonfinite_steps
        self.sigterm = False
        self.streak = torch.zeros((), device=accelerator.device)  # consecutive non-finite losses
        self.longest = torch.zeros((), device=accelerator.device)  # longest streak since the last check
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame) -> None:
        self.sigterm = True
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once

    def observe(self, loss: torch.Tensor) -> None:
        """Count the non-finite streak on the device, in place."""
        finite = torch.isfinite(loss.detach())
        self.streak.copy_(torch.where(finite, torch.zeros_like(self.streak), self.streak + 1))
        torch.maximum(self.longest, self.streak, out=self.longest)

    @property
    def counters(self) -> list[torch.Tensor]:
        return [self.streak, self.longest]

    def check(self) -> tuple[bool, bool]:
        """(preempted, diverged) on every rank; call on all ranks."""
        flags = torch.stack(
            [
                torch.tensor(float(self.sigterm), device=self.accelerator.device),
                (self.longest >= self.max_nonfinite_steps).float(),
            ]
        )
        flags = self.accelerator.reduce(flags, reduction="sum").tolist()
        self.longest.copy_(self.streak)
        return flags[0] > 0, flags[1] > 0


class LaunchError(UsageError, RuntimeError):
    """A launch that would not train correctly."""


def check_world_size(accelerator: Accelerator) -> None:
    """N processes that each think they are alone."""
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched > 1 and accelerator.num_processes != launched:
        raise LaunchError(
            f"The launcher started {launched} processes but each one sees a world of "
            f"{accelerator.num_processes}: they would train independently and overwrite each other's files. "
            "On CPU use accelerate_configs/cpu_2proc.yaml (distributed_type MULTI_GPU, use_cpu false)."
        )


def check_strategy(lora_r: int) -> None:
    """Refused before the Accelerator: DeepSpeed (FSDP2 is the tested sharding), and LoRA under FSDP (merging needs
    whole parameters)."""
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        raise LaunchError(
            "DeepSpeed is not supported here: to shard a model that outgrows one GPU, launch with "
            "accelerate_configs/fsdp.yaml (FSDP2); for data parallelism, accelerate_configs/multi_gpu.yaml"
        )
    if lora_r and os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        raise LaunchError(
            "lora_r: LoRA is not supported under FSDP (the adapters are merged into a copy of the model, which "
            "sharded parameters do not allow); launch LoRA with DDP, accelerate_configs/multi_gpu.yaml: each GPU holds "
            "the frozen base once, and the adapters and their optimizer state are small"
        )
