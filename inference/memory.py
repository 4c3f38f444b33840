"""Keep a long-running service's resident memory flat under varied request shapes (docs/serving.md, "Memory").

glibc raises its mmap threshold as large blocks are freed, so activations of ever-changing sizes end up in heap
arenas whose odd holes are rarely returned: the threshold is fixed at 1 MiB instead. `freeze_long_lived` moves what
start-up made into the collector's permanent generation, so a collection walks only what requests allocate.
oneDNN's primitive caches are bounded by their own capacities (ONEDNN_PRIMITIVE_CACHE_CAPACITY, LRU_CACHE_CAPACITY).
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
    """The C library when it is glibc (mallopt with M_MMAP_THRESHOLD), else None (macOS, musl, Windows)."""
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return libc if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt") else None


def keep_large_blocks_off_the_heap(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold at `threshold` bytes for this process; False where the C library is not glibc
    (nothing changes there)."""
    libc = _glibc()
    if libc is None:
        logger.debug("Not glibc: the allocator's mmap threshold is left as it is")
        return False
    applied = bool(libc.mallopt(_M_MMAP_THRESHOLD, int(threshold)))
    logger.debug("glibc mmap threshold fixed at %d bytes: %s", threshold, applied)
    return applied


def freeze_long_lived() -> None:
    """After start-up or a reload: collect once (the previous model's cycles too: everything frozen before is
    collectable again first), then exempt every surviving object from later collections (gc.freeze)."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    logger.debug("%d long-lived objects exempt from garbage collection", gc.get_freeze_count())
