"""Keep a long-running service's resident memory flat under varied request shapes (docs/serving.md, "Memory"). Called at
start-up and reload.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging

logger = logging.getLogger(__name__)

MMAP_THRESHOLD_BYTES = 1 << 20
_M_MMAP_THRESHOLD = -3  # glibc's malloc.h


def _glibc():
    """glibc, or None elsewhere."""
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return libc if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt") else None


def keep_large_blocks_off_the_heap(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold; False without glibc."""
    libc = _glibc()
    if libc is None:
        logger.debug("Not glibc: the allocator's mmap threshold is left as it is")
        return False
    applied = bool(libc.mallopt(_M_MMAP_THRESHOLD, int(threshold)))
    logger.debug("glibc mmap threshold fixed at %d bytes: %s", threshold, applied)
    return applied


def freeze_long_lived() -> None:
    """Collect once, then freeze the survivors out of later collections."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    logger.debug("%d long-lived objects exempt from garbage collection", gc.get_freeze_count())


def give_back_free_memory() -> bool:
    """Return the allocator's free pages to the system (glibc's malloc_trim); False without glibc."""
    libc = _glibc()
    return bool(libc is not None and hasattr(libc, "malloc_trim") and libc.malloc_trim(0))
