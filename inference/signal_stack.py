"""Keep a thread's alternate signal stack its own across calls into a library that replaces it.

OpenVINO's CPU plugin gives its thread an alternate signal stack and unmaps it when destroyed, restoring the previous
one only when destroyed on the same thread in reverse order; otherwise the next signal handled there (SIGTERM,
SIGCHLD) crashes the process. `kept()` restores the calling thread's stack after the call, so a plugin's stack is
never the thread's. Linux with glibc only; elsewhere it does nothing.
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
    """The calling thread's alternate signal stack: (address, flags, size); None where this cannot be read."""
    if _SIGALTSTACK is None:
        return None
    stack = _Stack()
    if _SIGALTSTACK(None, ctypes.byref(stack)) != 0:
        return None
    return stack.ss_sp or 0, stack.ss_flags, stack.ss_size


@contextlib.contextmanager
def kept():
    """Run the block, then give the calling thread back the alternate signal stack it had before."""
    before = current()
    try:
        yield
    finally:
        if before is not None and current() != before:
            address, flags, size = before
            _SIGALTSTACK(ctypes.byref(_Stack(address or None, flags, size)), None)
