"""Keep a thread's alternate signal stack its own across calls into a library that replaces it (OpenVINO's CPU plugin).
Called by the runtime runners.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys


class _Stack(ctypes.Structure):  # stack_t (sigaltstack(2))
    _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]


def _sigaltstack():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).sigaltstack
    except (OSError, AttributeError):
        return None


_SIGALTSTACK = _sigaltstack()


def current() -> tuple[int, int, int] | None:
    """The thread's alternate signal stack, or None."""
    if _SIGALTSTACK is None:
        return None
    stack = _Stack()
    if _SIGALTSTACK(None, ctypes.byref(stack)) != 0:
        return None
    return stack.ss_sp or 0, stack.ss_flags, stack.ss_size


@contextlib.contextmanager
def kept():
    """Run the block, then restore the thread's signal stack."""
    before = current()
    try:
        yield
    finally:
        if before is not None and current() != before:
            address, flags, size = before
            _SIGALTSTACK(ctypes.byref(_Stack(address or None, flags, size)), None)
