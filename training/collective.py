"""The one way the ranks agree on something only one of them should work out.

`decided_on_main(accelerator, decide)` runs `decide()` on the main process alone and hands its result to every rank;
a UserError it raises is raised on every rank, so none is left waiting in a collective (anything else is a bug and
keeps its traceback; the launcher stops the others). `main_first(accelerator, work)` is accelerate's
`main_process_first` with the same rule.
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
    """`work()` on the main process, then on the others; a UserError on the main process raised on every rank."""
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
