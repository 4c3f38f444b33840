"""Other libraries' log chatter held back while loading and converting."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


@contextlib.contextmanager
def quiet(*names: str, level: int = logging.ERROR) -> Iterator[None]:
    """Loggers `names` drop lines below `level` for the duration."""
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
    """No transformers progress bar or load report."""
    import transformers

    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()
    try:
        with quiet("transformers"):
            yield
    finally:
        if bars:
            transformers.utils.logging.enable_progress_bar()
