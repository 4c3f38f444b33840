"""Keep a long-running service's resident memory flat under varied request shapes.

Every micro-batch has its own (batch, padded length) shape, so the activation tensors of one forward pass are
allocated and freed in ever-changing sizes of several megabytes. glibc's malloc serves large blocks with mmap
(handed back to the system on free) but raises that threshold each time such a block is freed, up to 32 MiB;
after a few batches every activation comes from the heap arenas instead, whose free holes of odd sizes are
rarely reused or returned, so RSS creeps up with the variety of shapes seen (docs/serving.md, "Memory").
Fixing the threshold (mallopt M_MMAP_THRESHOLD, which also switches the adjustment off) keeps every block of
1 MiB or more on mmap: freed blocks go back to the system at once. The small blocks below it are reused well.

Python's cyclic garbage collector is the other cost of a long-lived process: a full collection walks every object
alive, and a loaded model, its tokenizer and the libraries hold millions. Triggered by the allocations of serving
itself, each one stops every thread (the event loop and the model thread alike) for a long pause; under load that
was the service's tail latency (docs/serving.md, "Memory"). `freeze_long_lived` moves what start-up made into the
collector's permanent generation, so collections walk only what requests allocate since.

oneDNN's primitive caches (used by bf16 and fp16 matmuls on CPU) are bounded by their own capacities, 1024
entries each by default; ONEDNN_PRIMITIVE_CACHE_CAPACITY and LRU_CACHE_CAPACITY set before start-up lower them.
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
