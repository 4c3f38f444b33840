"""Reload without downtime: watch the checkpoint files, load a new model in the background, swap it in.

Training replaces the files with atomic renames, but the weights, config and tokenizer change one after
the other; a new set is loaded only once its signature has been stable for one more polling interval. A set
that fails to load is refused with a logged error and the old model keeps serving; it is retried only when
the files change again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from inference.loading import CheckpointError, LoadedModel, signature

logger = logging.getLogger(__name__)


class CheckpointWatcher(threading.Thread):
    def __init__(
        self,
        checkpoint_dir: str,
        interval_s: float,
        initial: tuple,
        *,
        load: Callable[[], LoadedModel],
        on_loaded: Callable[[LoadedModel], None],
        on_failed: Callable[[], None],
    ):
        super().__init__(name="checkpoint-watcher", daemon=True)
        self.checkpoint_dir, self.interval_s = checkpoint_dir, interval_s
        self.load, self.on_loaded, self.on_failed = load, on_loaded, on_failed
        self._served, self._candidate = initial, None
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            current = signature(self.checkpoint_dir)
            if current == self._served:
                self._candidate = None
            elif current != self._candidate:
                self._candidate = current  # changed: wait one more interval for the other files
            else:
                self._served, self._candidate = current, None
                self.reload()

    def reload(self) -> None:
        try:
            loaded = self.load()
        except (CheckpointError, OSError, ValueError, RuntimeError) as exc:
            logger.error(
                "Refused the new checkpoint in %s, still serving the previous model: %s",
                self.checkpoint_dir,
                " ".join(str(exc).split())[:300],
            )
            self.on_failed()
            return
        self.on_loaded(loaded)
