"""Reload without downtime: watch the checkpoint files, load a new model in the background, swap it in.

Training replaces the files with atomic renames, but the weights, config and tokenizer change one after
the other; a new set is loaded only once its signature has been stable for one more polling interval. A set
that fails to load or to warm up, whatever the exception, is refused with a logged error and a counted failure,
and the old model keeps serving; it is retried only when the files change again. A folder that cannot be scanned
for a while (a file vanishing mid-scan, too many open files, a network mount away) is a warning, once, and polling
goes on; `on_exit` reports the thread's end, so /ready and a metric show a watcher that has stopped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from contract.loading import CheckpointError, LoadedModel, TornCheckpoint, signature

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
        on_exit: Callable[[], None] = lambda: None,
    ):
        super().__init__(name="checkpoint-watcher", daemon=True)
        self.checkpoint_dir, self.interval_s = checkpoint_dir, interval_s
        self.load, self.on_loaded, self.on_failed, self.on_exit = load, on_loaded, on_failed, on_exit
        self._served, self._candidate = initial, None
        self._stop_event = threading.Event()
        self._scan_failing = False

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)

    def run(self) -> None:
        try:
            self.poll()
        finally:
            self.on_exit()

    def poll(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            current = self.scan()
            if current is None:
                continue
            if current == self._served:
                self._candidate = None
            elif current != self._candidate:
                self._candidate = current  # changed: wait one more interval for the other files
            else:
                self._served, self._candidate = current, None
                self.reload()

    def scan(self) -> tuple | None:
        """The folder's signature, or None (one warning per failing spell) when it cannot be read right now."""
        try:
            current = signature(self.checkpoint_dir)
        except OSError as exc:
            if not self._scan_failing:
                logger.warning("Cannot scan %s for a new checkpoint (%s); retrying.", self.checkpoint_dir, exc)
            self._scan_failing = True
            return None
        if self._scan_failing:
            logger.info("Scanning %s again.", self.checkpoint_dir)
        self._scan_failing = False
        return current

    def reload(self) -> None:
        """Load and swap in the new set; any failure refuses it and the previous model keeps serving. A torn set
        (config.json and weights of different saves) or files that changed while loading are not refused but waited
        for: the next change is loaded once settled. Optimized runtimes raise their own exception types
        (onnxruntime's InvalidProtobuf, OpenVINO's), so every Exception is refused here: this thread must outlive
        whatever one checkpoint does to it."""
        try:
            loaded = self.load()
            if signature(self.checkpoint_dir) != loaded.signature:
                logger.info("%s changed while loading; waiting for it to settle.", self.checkpoint_dir)
                return
            self.on_loaded(loaded)
        except TornCheckpoint as exc:
            logger.warning("Not loading %s yet: %s", self.checkpoint_dir, exc)
        except Exception as exc:  # noqa: BLE001 - see the docstring; the error is logged and counted, never lost
            what = str(exc) if isinstance(exc, CheckpointError) else f"{type(exc).__name__}: {exc}"
            logger.error(
                "Refused the new checkpoint in %s, still serving the previous model: %s",
                self.checkpoint_dir,
                " ".join(what.split())[:300],
            )
            self.on_failed()
