"""The one way the ranks agree on something one of them works out: the main process decides, every rank acts the same, a
UserError raised on all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from accelerate import Accelerator
from accelerate.utils import broadcast_object_list

from contract.errors import UserError

T = TypeVar("T")


def decided_on_main(accelerator: Accelerator, decide: Callable[[], T]) -> T:
    outcome: list = [None, None]  # [result, error]
    if accelerator.is_main_process:
        try:
            outcome = [decide(), None]
        except UserError as exc:
            outcome = [None, exc]
    result, error = broadcast_object_list(outcome)
    if error is not None:
        raise error
    return result


def main_first(accelerator: Accelerator, work: Callable[[], T]) -> T:
    """`work()` on the main process, then the others; its UserError raised everywhere."""
    result, failure = None, None
    if accelerator.is_main_process:
        try:
            result = work()
        except UserError as exc:
            failure = exc
    (failure,) = broadcast_object_list([failure])  # also the barrier the others wait at
    if failure is not None:
        raise failure
    return result if accelerator.is_main_process else work()
