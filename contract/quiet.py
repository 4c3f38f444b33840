"""Other libraries' log chatter held back while the checkpoint reader and the runtime converters call them."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


@contextlib.contextmanager
def quiet(*names: str, level: int = logging.ERROR) -> Iterator[None]:
    """Other libraries' loggers `names` hold back lines below `level` for the duration (a model conversion's
    chatter about things the service does not use), then log as before."""
    loggers = [logging.getLogger(name) for name in names]
    before = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(level)
    try:
        yield
    finally:
        for log, old in zip(loggers, before):
            log.setLevel(old)


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """No per-load progress bar and load report of transformers in the service's log."""
    import transformers

    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()
    try:
        with quiet("transformers"):
            yield
    finally:
        if bars:
            transformers.utils.logging.enable_progress_bar()
