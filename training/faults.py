"""Test-only fault injection, driven by one environment variable. Never set it in a real run.

    DISTILBERT_AGNEWS_FAULT=nan_loss_from_step:N     the loss is NaN from optimizer step N on, on every rank
    DISTILBERT_AGNEWS_FAULT=raise_on_rank:R:N        rank R raises RuntimeError right after optimizer step N
    DISTILBERT_AGNEWS_FAULT=hang_on_rank:R:N         rank R stops responding right after optimizer step N
    DISTILBERT_AGNEWS_FAULT=kill_in_save_state:N     the main process SIGKILLs itself halfway through saving
                                                     state/step_N (files written, not yet renamed into place)
    DISTILBERT_AGNEWS_FAULT=kill_in_save_model:K     the main process SIGKILLs itself halfway through writing
                                                     the weights of its K-th best-model save

The tests use them to prove that failures stop the whole job and never corrupt what was saved.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Optional

FAULT_ENV = "DISTILBERT_AGNEWS_FAULT"
_model_saves = 0


def arguments(kind: str) -> Optional[list[int]]:
    """The integer arguments of the injected fault when it is of this kind, else None."""
    name, _, args = os.environ.get(FAULT_ENV, "").partition(":")
    return [int(a) for a in args.split(":")] if name == kind else None


def after_optimizer_step(step: int, rank: int) -> None:
    if arguments("raise_on_rank") == [rank, step]:
        raise RuntimeError(f"injected fault ({FAULT_ENV}): rank {rank} failed after optimizer step {step}")
    if arguments("hang_on_rank") == [rank, step]:
        while True:  # what a deadlocked rank looks like to its peers: it never reaches the next collective
            time.sleep(3600)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def in_save_state(step: int) -> None:
    if arguments("kill_in_save_state") == [step]:
        _die()


def in_save_model() -> None:
    global _model_saves
    _model_saves += 1
    if arguments("kill_in_save_model") == [_model_saves]:
        _die()
