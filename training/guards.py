"""Starting and stopping safely: a launch whose processes do not form one group is refused; preemption
(SIGTERM) and divergence (non-finite losses) are decided by all ranks together.

A rank that receives SIGTERM only raises a flag; every `stop_check_steps` steps, and before any evaluation or save,
the ranks sum their flags in one tiny all-reduce, so they all stop at the same step (a resumable state saved after
SIGTERM; an error after `max_nonfinite_steps` non-finite losses). The non-finite streak is counted on the device.
"""

from __future__ import annotations

import os
import signal

import torch
from accelerate import Accelerator

from contract.errors import UsageError, UserError


class TrainingDiverged(UserError, RuntimeError):
    """The loss stayed non-finite; the run stops without saving the diverged model."""


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
        """Count the non-finite streak on the device (no host sync), in place: a captured step keeps these tensors
        (training/speed/step_graph.py)."""
        finite = torch.isfinite(loss.detach())
        self.streak.copy_(torch.where(finite, torch.zeros_like(self.streak), self.streak + 1))
        torch.maximum(self.longest, self.streak, out=self.longest)

    @property
    def counters(self) -> list[torch.Tensor]:
        return [self.streak, self.longest]

    def check(self) -> tuple[bool, bool]:
        """(preempted, diverged), identical on every rank. A collective: call it on all ranks at the same step."""
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
    """The processes were started in a way that would not train correctly."""


def check_world_size(accelerator: Accelerator) -> None:
    """Refuse N launched processes that each believe they are alone (N trainings writing the same files)."""
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched > 1 and accelerator.num_processes != launched:
        raise LaunchError(
            f"The launcher started {launched} processes but each one sees a world of "
            f"{accelerator.num_processes}: they would train independently and overwrite each other's files. "
            "On CPU use accelerate_configs/cpu_2proc.yaml (distributed_type MULTI_GPU, use_cpu false)."
        )


def check_strategy(lora_r: int) -> None:
    """Before the Accelerator is built: DeepSpeed is refused (FSDP2 is the sharded strategy this project tests), and
    LoRA under FSDP (the adapters are merged into a copy of the model, which FSDP's sharded parameters do not allow;
    DDP keeps one frozen base per GPU, and the adapters and their optimizer state are small)."""
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
