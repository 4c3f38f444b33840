"""The one way the ranks agree on something only one of them should work out.

`decided_on_main(accelerator, decide)` runs `decide()` on the main process alone (it reads or writes files the
others must not touch at once: the output folder's lock, a resumable state, the data files) and hands its result to
every rank. Should it raise a UserError (contract/errors.py), every rank raises that same error, so each one stops
with the same line and none is left waiting in a collective. Anything else it raises is a bug and keeps its traceback on
the main process; the launcher then stops the other ranks (torch elastic ends every rank once one has failed).

`main_first(accelerator, work)` is accelerate's `main_process_first` (the main process runs `work` first, e.g. to
download or tokenize into a cache the others then read) with the same rule: accelerate's own context manager leaves
the other ranks waiting at its barrier when the main process raises inside it; here they raise the same UserError.
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
