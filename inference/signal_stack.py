"""Keep a thread's alternate signal stack its own across calls into a library that replaces it.

OpenVINO's CPU plugin gives the thread that creates it an alternate signal stack of its own (for AMX state) and
unmaps that stack when the plugin is destroyed. It puts the previous stack back only when it is destroyed on the
same thread, in reverse order of creation. Otherwise the thread keeps pointing at unmapped memory, and the next
signal handled on that thread (SIGTERM or SIGINT in the service, SIGCHLD after a subprocess, any Python handler: they
run on the alternate stack) kills the process with SIGSEGV. Two runtimes built and dropped on one thread are
enough (tests/inference/test_runtimes.py).

`kept()` records the calling thread's alternate stack and restores it afterwards, so a plugin's stack is never the
thread's: destroyed anywhere, it unmaps memory no thread uses. Linux with glibc only, where the plugin does this;
elsewhere it does nothing.
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
