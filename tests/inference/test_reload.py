"""The checkpoint watcher under filesystem trouble: files vanishing mid-scan, a scan that fails for a while,
a watcher that stops. Real folders; the service through FastAPI's TestClient."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from contract import files
from contract.loading import TornCheckpoint, load_model, signature
from inference.engine import reload
from inference.engine.reload import CheckpointWatcher
from tests.helpers.service import wait_for
from tests.inference.test_app import TEXTS, make_client


def watch(folder, loaded: list, interval_s: float = 0.02) -> CheckpointWatcher:
    watcher = CheckpointWatcher(
        str(folder),
        interval_s,
        signature(folder),
        load=lambda: SimpleNamespace(signature=signature(folder)),  # what load_model records: the files it read
        on_loaded=lambda model: loaded.append(model.signature),
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
    try:
        churner.start()
        time.sleep(3)  # thousands of scans racing thousands of renames
        stop.set()
        churner.join()
        assert watcher.is_alive()
        config = checkpoint_copy / files.CONFIG
        config.write_text(config.read_text() + " ")  # a real change after the storm is still picked up
        changed = signature(checkpoint_copy)
        # the storm may leave a load of its own last state in flight: what counts is that the change is served
        wait_for(lambda: loaded[-1:], lambda last: last == [changed])
    finally:
        stop.set()
        watcher.stop()


def test_a_scan_failing_for_a_while_is_one_warning_and_polling_goes_on(checkpoint_copy, monkeypatch):
    failures = {"left": 20}
    real = reload.signature

    def flaky(folder):
        if failures["left"] and Path(folder) == checkpoint_copy:  # not another test's watcher on this worker
            failures["left"] -= 1
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real(folder)

    monkeypatch.setattr(reload, "signature", flaky)
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append  # the service's own logging set-up may stop propagation to pytest's handler
    log = logging.getLogger("inference.engine.reload")
    level = log.level
    log.setLevel(logging.INFO)  # setLevel, not the attribute: it also clears the logger's isEnabledFor cache
    log.addHandler(handler)
    loaded: list = []
    watcher = watch(checkpoint_copy, loaded)
    try:
        wait_for(lambda: failures["left"], lambda left: left == 0)
        config = checkpoint_copy / files.CONFIG
        config.write_text(config.read_text() + " ")
        wait_for(lambda: list(loaded), lambda got: got == [signature(checkpoint_copy)])
    finally:
        watcher.stop()
        log.removeHandler(handler)
        log.setLevel(level)
    # only this folder's records: a watcher of another test on this worker may log to the same logger
    records = [r for r in records if str(checkpoint_copy) in r.getMessage()]
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


def permuted_copy(source: Path, target: Path) -> Path:
    """The same model with its labels reversed."""
    shutil.copytree(source, target)
    config = json.loads((source / files.CONFIG).read_text())
    n = len(config["id2label"])
    order = list(reversed(range(n)))  # new id k is old id order[k]
    state = torch.load(source / files.WEIGHTS, weights_only=True)
    for name, tensor in state.items():
        if name.startswith("classifier.") and tensor.shape[0] == n:
            state[name] = tensor[order].clone()
    torch.save(state, target / files.WEIGHTS)
    config["id2label"] = {str(k): config["id2label"][str(order[k])] for k in range(n)}
    config["label2id"] = {label: int(k) for k, label in config["id2label"].items()}
    config[files.WEIGHTS_SHA256] = {files.WEIGHTS: files.tensors_sha256(state)}
    (target / files.CONFIG).write_text(json.dumps(config))
    return target


def install(source: Path, folder: Path, weights_first: bool, pause_s: float) -> None:
    """Copy a model's weights and config.json over the served ones one by one (each by os.replace), in either
    order, with the folder torn (one model's weights, the other's config) for `pause_s` between them."""
    names = [files.WEIGHTS, files.CONFIG] if weights_first else [files.CONFIG, files.WEIGHTS]
    for name in names:
        shutil.copy(source / name, folder / f".{name}.incoming")
        os.replace(folder / f".{name}.incoming", folder / name)
        time.sleep(pause_s)


def test_a_torn_folder_is_never_loaded_and_names_both_files(checkpoint_copy, tmp_path):
    other = permuted_copy(checkpoint_copy, tmp_path / "permuted")
    shutil.copy(other / files.WEIGHTS, checkpoint_copy / files.WEIGHTS)  # the new weights, the old config.json
    with pytest.raises(TornCheckpoint, match=r"distilbert_agnews.pt: sha256 \w+, but config.json beside it"):
        load_model(str(checkpoint_copy), dtype="fp32")
    shutil.copy(other / files.CONFIG, checkpoint_copy / files.CONFIG)  # both copied: one consistent set
    assert load_model(str(checkpoint_copy), dtype="fp32").labels == load_model(str(other), dtype="fp32").labels


@pytest.mark.slow
def test_label_permuted_swaps_under_load_never_mislabel_an_answer(checkpoint_copy, tmp_path):
    """Swaps under load: every answer names the text's best label."""
    original = Path(shutil.copytree(checkpoint_copy, tmp_path / "original"))
    permuted = permuted_copy(checkpoint_copy, tmp_path / "permuted")
    texts = [f"{TEXTS[i % len(TEXTS)]} Report number {i}." for i in range(200)]
    with make_client(checkpoint_copy, backend="torch", reload_interval_s=0.02) as c:
        expected = {}
        for text in texts:
            answer = c.post("/predict", json={"inputs": text}).json()
            if answer[0]["score"] - answer[1]["score"] > 1e-3:  # no near-tie that batching noise could flip
                expected[text] = answer[0]["label"]
        chosen = list(expected)
        batches = [[chosen[(32 * i + k) % len(chosen)] for k in range(32)] for i in range(313)]  # 10,016 answers
        stop, swaps, sha256s = threading.Event(), [0], set()

        def swap() -> None:
            while not stop.is_set():
                source = permuted if swaps[0] % 2 == 0 else original
                install(source, checkpoint_copy, weights_first=swaps[0] % 4 < 2, pause_s=0.05)
                swaps[0] += 1
                time.sleep(0.2)
                sha256s.add(c.get("/info").json()["distilbert_agnews"]["checkpoint"]["sha256"])

        swapper = threading.Thread(target=swap)
        swapper.start()
        try:
            with ThreadPoolExecutor(16) as pool:
                responses = list(
                    pool.map(lambda batch: c.post("/predict", json={"inputs": [[t] for t in batch]}), batches)
                )
        finally:
            stop.set()
            swapper.join()
        reloads = c.get("/info").json()["distilbert_agnews"]["checkpoint"]["reloads"]
    assert all(r.status_code == 200 for r in responses)
    answers = [(text, answer) for batch, r in zip(batches, responses) for text, answer in zip(batch, r.json())]
    wrong = [(text, answer[0]["label"]) for text, answer in answers if answer[0]["label"] != expected[text]]
    assert len(answers) >= 10_000 and not wrong, f"{len(wrong)} of {len(answers)} answers mislabelled: {wrong[:3]}"
    assert swaps[0] >= 4 and reloads >= 2 and len(sha256s) == 2, (swaps, reloads, sha256s)


def with_nan_weights(folder: Path) -> None:
    """A diverged model saved consistently (config.json records its tensors): refused for its NaN values alone."""
    state = torch.load(folder / files.WEIGHTS, weights_only=True)
    state["classifier.weight"][0, 0] = float("nan")
    torch.save(state, folder / files.WEIGHTS)
    edit_json(folder / files.CONFIG, {files.WEIGHTS_SHA256: {files.WEIGHTS: files.tensors_sha256(state)}})


def with_a_stride_past_the_window(folder: Path) -> None:
    edit_json(folder / files.CONFIG, {"long_text": "chunk", "chunk_stride": 10_000})


def with_a_longer_tokenizer(folder: Path) -> None:
    edit_json(folder / files.TOKENIZER_DIR / "tokenizer_config.json", {"model_max_length": 512})


def edit_json(path: Path, fields: dict) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


@pytest.mark.parametrize(
    "edit, refusal",
    [
        (with_nan_weights, "classifier.weight holds 1 NaN or infinite values"),
        (with_a_stride_past_the_window, "chunk_stride: must be smaller than a window"),
        (with_a_longer_tokenizer, "MAX_BATCH_TOKENS: must be at least the model's maximum input length"),
    ],
    ids=["nan-weights", "stride", "token-budget"],
)
def test_a_reload_refuses_what_start_up_refuses(checkpoint_copy, tmp_path, edit, refusal, capfd):
    """One set of checks for both: a folder that start-up refuses is refused at reload too, with the same line, and
    the previous model keeps serving."""
    edit_json(checkpoint_copy / files.TOKENIZER_DIR / "tokenizer_config.json", {"model_max_length": 128})
    settings = {"backend": "torch", "max_batch_tokens": 256}
    refused = Path(shutil.copytree(checkpoint_copy, tmp_path / "refused"))
    edit(refused)
    with pytest.raises(Exception, match=refusal):
        with make_client(refused, **settings):
            pass
    with make_client(checkpoint_copy, reload_interval_s=0.05, **settings) as c:
        before = c.post("/predict", json={"inputs": TEXTS[0]}).json()
        for name in (files.TOKENIZER_DIR, files.WEIGHTS, files.CONFIG):  # each file whole, by rename
            staged = checkpoint_copy / f".{name}.new"
            (shutil.copytree if name == files.TOKENIZER_DIR else shutil.copy)(refused / name, staged)
            if name == files.TOKENIZER_DIR:
                shutil.rmtree(checkpoint_copy / name)
            os.replace(staged, checkpoint_copy / name)
        wait_for(lambda: c.get("/metrics").text, lambda text: 'te_model_reloads{result="failed"} 1.0' in text)
        assert c.get("/ready").status_code == 200
        assert c.post("/predict", json={"inputs": TEXTS[0]}).json() == before
        assert c.get("/info").json()["distilbert_agnews"]["checkpoint"]["reloads"] == 0
    assert refusal in capfd.readouterr().err


def test_the_runtime_race_never_puts_older_weights_back_over_a_reload(checkpoint_copy, monkeypatch):
    """A reload during the race's warm-up swaps last."""
    from dataclasses import replace

    from inference.engine import service as service_module

    with make_client(checkpoint_copy, backend="torch") as client:
        service = client.app.state.service
        old = service.engine.current
        measured, new = replace(old, runtime="measured"), replace(old, sha256="f" * 64)  # same weights / new ones
        warming, go_on = threading.Event(), threading.Event()
        warm_up = service_module.warm_up

        def held_warm_up(loaded, limits):
            if loaded is measured:
                warming.set()
                go_on.wait(10)
            warm_up(loaded, limits)

        monkeypatch.setattr(service_module, "warm_up", held_warm_up)
        race = threading.Thread(target=service.settle_runtime, args=(measured,))
        race.start()
        assert warming.wait(10)
        reload_ = threading.Thread(target=service.swap_in, args=(new,))
        reload_.start()
        reload_.join(0.3)  # it waits for the race to finish its swap
        go_on.set()
        race.join(10)
        reload_.join(10)
        assert service.engine.current is new
