"""The checkpoint watcher under filesystem trouble: files vanishing mid-scan, a scan that fails for a while,
a watcher that stops. Real folders; the service through FastAPI's TestClient."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import threading
import time

import torch

from contract import files
from inference import reload
from inference.loading import signature
from inference.reload import CheckpointWatcher
from tests.inference.conftest import wait_for
from tests.inference.test_app import TEXTS, make_client


def watch(folder, loaded: list, interval_s: float = 0.02) -> CheckpointWatcher:
    watcher = CheckpointWatcher(
        str(folder),
        interval_s,
        signature(folder),
        load=lambda: "model",
        on_loaded=loaded.append,
        on_failed=lambda: None,
    )
    watcher.start()
    return watcher


def churn(folder, stop: threading.Event) -> None:
    """What rsync and training's own tokenizer swap do: temporary files appear and vanish, tokenizer/ is
    renamed away and back, many times a second."""
    tokenizer = folder / files.TOKENIZER_DIR
    i = 0
    while not stop.is_set():
        i += 1
        temporary = tokenizer / f".tokenizer.json.{i}"
        temporary.write_text("x")
        temporary.unlink()
        moved = folder / f".{files.TOKENIZER_DIR}.old"
        tokenizer.rename(moved)
        moved.rename(tokenizer)


def test_files_vanishing_mid_scan_never_stop_the_watcher(checkpoint_copy):
    loaded: list = []
    watcher = watch(checkpoint_copy, loaded, interval_s=0.001)
    stop = threading.Event()
    churner = threading.Thread(target=churn, args=(checkpoint_copy, stop))
    churner.start()
    time.sleep(3)  # thousands of scans racing thousands of renames
    stop.set()
    churner.join()
    assert watcher.is_alive()
    loaded.clear()
    config = checkpoint_copy / files.CONFIG
    config.write_text(config.read_text() + " ")  # a real change after the storm is still picked up
    wait_for(lambda: list(loaded), lambda got: got == ["model"])
    watcher.stop()


def test_a_scan_failing_for_a_while_is_one_warning_and_polling_goes_on(checkpoint_copy, monkeypatch):
    failures = {"left": 20}
    real = reload.signature

    def flaky(folder):
        if failures["left"]:
            failures["left"] -= 1
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real(folder)

    monkeypatch.setattr(reload, "signature", flaky)
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append  # the service's own logging set-up may stop propagation to pytest's handler
    log = logging.getLogger("inference.reload")
    level = log.level
    log.setLevel(logging.INFO)  # setLevel, not the attribute: it also clears the logger's isEnabledFor cache
    log.addHandler(handler)
    loaded: list = []
    try:
        watcher = watch(checkpoint_copy, loaded)
        wait_for(lambda: failures["left"], lambda left: left == 0)
        config = checkpoint_copy / files.CONFIG
        config.write_text(config.read_text() + " ")
        wait_for(lambda: list(loaded), lambda got: got == ["model"])
        watcher.stop()
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    warnings = [r for r in records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "Too many open files" in warnings[0].getMessage()
    assert any("Scanning" in r.getMessage() and "again" in r.getMessage() for r in records)


def test_a_stopped_watcher_fails_ready_and_shows_in_metrics(checkpoint_copy, capfd):
    with make_client(checkpoint_copy, backend="torch", reload_interval_s=0.05) as c:
        assert c.get("/ready").status_code == 200
        assert "te_checkpoint_watcher_up 1.0" in c.get("/metrics").text
        service = c.app.state.service
        service.watcher.stop()  # as if it had died
        answer = c.get("/ready")
        assert answer.status_code == 503 and "checkpoint watcher has stopped" in answer.json()["error"]
        assert "te_checkpoint_watcher_up 0.0" in c.get("/metrics").text
        assert c.post("/predict", json={"inputs": TEXTS[0]}).status_code == 200  # the model still answers
    logged = capfd.readouterr().err
    assert " ERROR inference " in logged and "has stopped; /ready now fails" in logged


def test_a_tokenizer_swap_during_a_reload_is_served_once_settled(checkpoint_copy):
    """Training replaces tokenizer/ by renaming a staged folder over it; the watcher reloads once stable."""
    with make_client(checkpoint_copy, backend="torch", reload_interval_s=0.1) as c:  # runtimes: test_runtimes
        before = c.get("/info").json()["distilbert_agnews"]["checkpoint"]["reloads"]
        staged = checkpoint_copy / ".tokenizer.staged"
        shutil.copytree(checkpoint_copy / files.TOKENIZER_DIR, staged)
        old = checkpoint_copy / ".tokenizer.old"
        (checkpoint_copy / files.TOKENIZER_DIR).rename(old)
        staged.rename(checkpoint_copy / files.TOKENIZER_DIR)
        shutil.rmtree(old)
        weights = checkpoint_copy / files.WEIGHTS
        torch.save(torch.load(weights, weights_only=True), weights.with_suffix(".tmp"))
        os.replace(weights.with_suffix(".tmp"), weights)
        wait_for(
            lambda: c.get("/info").json()["distilbert_agnews"]["checkpoint"]["reloads"],
            lambda reloads: reloads == before + 1,
        )
        assert c.get("/ready").status_code == 200
