"""Reload without downtime: watch the checkpoint files, load a new model in the background, swap it in. Started by the
service's lifespan.

A change is loaded once the files stop changing; a failed load keeps the old model serving.
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
        adapter_dirs: tuple[str, ...] = (),
    ):
        """`adapter_dirs`: the folders of the served model's other adapters (LORA_ADAPTERS), watched with it: a change
        in any one loads the whole set again."""
        super().__init__(name="checkpoint-watcher", daemon=True)
        self.checkpoint_dir, self.interval_s, self.adapter_dirs = checkpoint_dir, interval_s, adapter_dirs
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
        """The folders' signature, or None when unreadable now."""
        try:
            current = self.signature()
        except OSError as exc:
            if not self._scan_failing:
                logger.warning("Cannot scan %s for a new checkpoint (%s); retrying.", self.checkpoint_dir, exc)
            self._scan_failing = True
            return None
        if self._scan_failing:
            logger.info("Scanning %s again.", self.checkpoint_dir)
        self._scan_failing = False
        return current

    def signature(self) -> tuple:
        """What the folders hold now (contract.loading.signature)."""
        if not self.adapter_dirs:
            return signature(self.checkpoint_dir)
        return (signature(self.checkpoint_dir), *(signature(folder) for folder in self.adapter_dirs))

    def reload(self) -> None:
        """Load and swap in the new set; a failure keeps the old model. A torn or changing set is waited for, not
        refused."""
        try:
            loaded = self.load()
            if self.signature() != read_from(loaded, self.adapter_dirs):
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


def read_from(loaded: LoadedModel, adapter_dirs: tuple[str, ...]) -> tuple:
    """What `loaded` (and its adapters, when watched) was read from, as CheckpointWatcher.signature() says it."""
    if not adapter_dirs:
        return loaded.signature
    return (loaded.signature, *(one.signature for one in loaded.adapters.values()))
