"""The conversion cache is trusted only when verified (inference/runtimes/cache.py)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from contract import files
from inference.runtimes import choice as runtimes
from inference.runtimes.cache import Cache
from inference.settings import SettingsError
from tests.helpers.files import read_only, save_new_weights
from tests.helpers.processes import cli_env
from tests.helpers.service import Reference, Server, run_cli, wait_for
from tests.inference.runtimes.test_runtimes import runtime_log, serve, served_logits, smoke_texts, torch_fp32_logits
from tests.inference.test_app import TEXTS, make_client

pytestmark = pytest.mark.skipif(
    not runtimes.installed("openvino"), reason="OpenVINO is not installed here (pip install '.[openvino]')"
)
FP32 = {"backend": "openvino", "dtype": "fp32"}  # one candidate, converted in about a second


def cache_of(folder: Path, loaded) -> Cache:
    return Cache(folder / files.RUNTIME_DIR / loaded.sha256[:16])


def served_folder(loaded, cache: Cache) -> str:
    """The model folder (in the cache) of what `loaded` serves."""
    name = f"{loaded.runtime} {loaded.precision}"
    return next(c["ir"] for r in cache.reports() for c in r["candidates"] if c["name"] == name)


def assert_serves_the_trained_model(loaded, checkpoint: Path) -> None:
    texts = smoke_texts()[:96]
    assert torch.allclose(served_logits(loaded, texts), torch_fp32_logits(Reference(checkpoint), texts), atol=1e-4)


def truncate(cache: Cache, model_folder: str) -> Path:
    weights = cache.folder / model_folder / "model.bin"
    weights.write_bytes(weights.read_bytes()[:1000])
    return weights


def zero_a_block(cache: Cache, model_folder: str) -> Path:
    """The same size, one block of weights zeroed: what a bad disk sector or a bad copy does."""
    weights = cache.folder / model_folder / "model.bin"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 4096] = bytes(4096)
    weights.write_bytes(bytes(data))
    return weights


def delete_the_folder(cache: Cache, model_folder: str) -> Path:
    shutil.rmtree(cache.folder / model_folder)
    return cache.folder / model_folder / "model.bin"


@pytest.mark.slow  # converts a model
@pytest.mark.parametrize("damage", [truncate, zero_a_block, delete_the_folder])
def test_a_damaged_converted_model_is_named_converted_again_and_never_served(checkpoint_copy, damage):
    first = serve(checkpoint_copy, **FP32)
    cache = cache_of(checkpoint_copy, first)
    model_folder = served_folder(first, cache)
    recorded = cache.digests()[f"{model_folder}/model.bin"]
    damaged = damage(cache, model_folder)
    with runtime_log() as lines:
        again = serve(checkpoint_copy, **FP32)
    warnings = [line for line in lines if str(damaged) in line]
    assert len(warnings) == 1 and warnings[0].endswith("not served"), lines
    assert any(line.startswith("Runtime: converted openvino fp32") for line in lines), lines
    assert cache.damage(model_folder) is None and cache.digests()[f"{model_folder}/model.bin"] == recorded
    assert_serves_the_trained_model(again, checkpoint_copy)


@pytest.mark.slow  # converts a model
def test_a_garbage_runtime_json_is_measured_again_and_unrecorded_files_are_converted_again(checkpoint_copy):
    first = serve(checkpoint_copy, **FP32)
    cache = cache_of(checkpoint_copy, first)
    model_folder = served_folder(first, cache)
    zero_a_block(cache, model_folder)  # a file that exists was reused without a check
    cache.report_file.write_text("{garbage")
    with runtime_log() as lines:
        again = serve(checkpoint_copy, **FP32)
    assert any("measuring openvino fp32" in line for line in lines), lines
    assert any(f"{cache.folder / model_folder}: no digest recorded" in line for line in lines), lines
    assert json.loads(cache.report_file.read_text())["files"] and cache.damage(model_folder) is None
    assert_serves_the_trained_model(again, checkpoint_copy)


def test_a_read_only_checkpoint_with_a_finished_conversion_starts_and_writes_nothing(checkpoint_copy, tmp_path):
    """What training's --export_runtime left (the service's default settings) is read where it lies; RUNTIME_CACHE,
    read-only as well, stays empty."""
    runtime_cache = tmp_path / "runtime_cache"
    runtime_cache.mkdir()
    folders = [checkpoint_copy, *(p for p in checkpoint_copy.rglob("*") if p.is_dir()), runtime_cache]
    with read_only(*folders), runtime_log() as lines:
        loaded = serve(checkpoint_copy, runtime_cache=str(runtime_cache))
    assert not any("converted" in line or "measuring" in line for line in lines), lines
    report = json.loads(next((checkpoint_copy / files.RUNTIME_DIR).glob(f"*/{files.RUNTIME_CHOICE}")).read_text())
    assert f"{loaded.runtime} {loaded.precision}" in {r["chosen"] for r in report["reports"]}
    assert list(runtime_cache.iterdir()) == []


@pytest.mark.slow  # converts a model
def test_a_read_only_runtime_cache_holding_the_conversion_needs_no_lock(checkpoint_copy, tmp_path):
    """A checkpoint that cannot be written converts into RUNTIME_CACHE; once that is read-only too, the next start
    reads the conversion there (before, it died creating its lock file)."""
    shutil.rmtree(checkpoint_copy / files.RUNTIME_DIR)
    runtime_cache = tmp_path / "runtime_cache"
    with read_only(checkpoint_copy):
        first = serve(checkpoint_copy, runtime_cache=str(runtime_cache), **FP32)
    cache = Cache(runtime_cache / first.sha256[:16])
    assert cache.report_for(json.loads(cache.report_file.read_text())["reports"][0]["key"]) is not None
    folders = [checkpoint_copy, runtime_cache, *(p for p in runtime_cache.rglob("*") if p.is_dir())]
    with read_only(*folders), runtime_log() as lines:
        again = serve(checkpoint_copy, runtime_cache=str(runtime_cache), **FP32)
    assert not any("converted" in line or "measuring" in line for line in lines), lines
    assert_serves_the_trained_model(again, checkpoint_copy)


def test_when_nothing_can_be_written_a_needed_conversion_is_one_line_naming_runtime_cache(checkpoint_copy, tmp_path):
    shutil.rmtree(checkpoint_copy / files.RUNTIME_DIR)
    runtime_cache = tmp_path / "runtime_cache"
    runtime_cache.mkdir()
    with read_only(checkpoint_copy, runtime_cache):
        with pytest.raises(SettingsError, match=r"^RUNTIME_CACHE: cannot write .* nor .*runtime_cache"):
            serve(checkpoint_copy, runtime_cache=str(runtime_cache), **FP32)
        result = run_cli(
            "--model_id", str(checkpoint_copy), "--backend", "openvino", env=cli_env(RUNTIME_CACHE=str(runtime_cache))
        )
    assert result.returncode == 2, result
    [line] = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert line.startswith("inference: error: RUNTIME_CACHE: cannot write") and "Traceback" not in result.stderr


def test_a_damaged_choice_where_nothing_can_be_written_serves_the_next_best_verified_candidate(
    checkpoint_copy, tmp_path
):
    first = serve(checkpoint_copy)  # the export's choice among every installed runtime's candidates
    cache = cache_of(checkpoint_copy, first)
    chosen = served_folder(first, cache) if first.runtime != "torch" else None
    if chosen is None:
        pytest.skip(f"PyTorch ({first.precision}) won the race on this CPU: no converted file to damage")
    labels = served_logits(first, TEXTS).argmax(-1)  # before the damage: OpenVINO maps the weights file lazily
    if (cache.folder / chosen / "model.bin").is_file():
        zero_a_block(cache, chosen)
    else:
        (cache.folder / chosen / files.RUNTIME_ONNX).write_bytes(b"damaged")
    runtime_cache = tmp_path / "runtime_cache"
    runtime_cache.mkdir()
    folders = [checkpoint_copy, *(p for p in checkpoint_copy.rglob("*") if p.is_dir()), runtime_cache]
    with read_only(*folders), runtime_log() as lines:
        again = serve(checkpoint_copy, runtime_cache=str(runtime_cache))
    assert any(str(cache.folder / chosen) in line and line.endswith("not served") for line in lines), lines
    assert any("nothing can be written to convert again; serving" in line for line in lines), lines
    assert (again.runtime, again.precision) != (first.runtime, first.precision)
    if again.runtime != "torch":
        assert cache.damage(served_folder(again, cache)) is None
    assert torch.equal(served_logits(again, TEXTS).argmax(-1), labels), "the next-best must give the chosen's labels"


@pytest.mark.slow  # a real process converting
def test_a_conversion_killed_by_sigterm_leaves_a_staging_folder_that_the_next_start_removes(checkpoint_copy):
    shutil.rmtree(checkpoint_copy / files.RUNTIME_DIR)
    sha = hashlib.sha256((checkpoint_copy / files.WEIGHTS).read_bytes()).hexdigest()
    cache = Cache(checkpoint_copy / files.RUNTIME_DIR / sha[:16])
    server = Server(checkpoint_copy, "--backend", "openvino", "--dtype", "int8")
    staging = wait_for(
        lambda: [p for p in cache.folder.glob(".openvino-*")] if cache.folder.is_dir() else [],
        lambda found: found,
        timeout=120,
    )
    server.process.send_signal(signal.SIGTERM)
    assert server.exit_code(30) is not None
    server.stop()
    assert all(p.exists() for p in staging), "the killed conversion left its staging folder"
    with runtime_log() as lines:
        loaded = serve(checkpoint_copy, backend="openvino", dtype="int8")
    assert not any(p.exists() for p in staging), list(cache.folder.iterdir())
    assert any(f"removing {staging[0]}, left by a process that stopped" in line for line in lines), lines
    assert loaded.runtime == "openvino" and not [p.name for p in cache.folder.iterdir() if p.name.startswith(".")]


def test_only_staging_of_dead_processes_is_removed(tmp_path):
    cache = Cache(tmp_path)
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = os.uname().nodename
    names = {
        "dead": f".openvino-fp32.{dead.pid}@{host}",
        "dead, an older version's name": f".onnxruntime-int8.{dead.pid}",
        "dead report": f".{files.RUNTIME_CHOICE}.{dead.pid}@{host}",
        "alive": f".openvino-int8-abc.{alive.pid}@{host}",
        "another host": f".openvino-fp32.{dead.pid}@elsewhere.example",
        "a converted model": "openvino-fp32",
    }
    for name in names.values():
        if files.RUNTIME_CHOICE in name:
            (tmp_path / name).write_text("{}")
        else:
            (tmp_path / name).mkdir()
    try:
        cache.remove_leftovers()
    finally:
        alive.kill()
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == sorted([names["alive"], names["another host"], names["a converted model"]])


@pytest.mark.skipif(not runtimes.installed("onnxruntime"), reason="ONNX Runtime is not installed here")
def test_the_watcher_survives_a_reload_failing_with_an_optimized_runtimes_own_exception(checkpoint_copy, monkeypatch):
    """onnxruntime raises InvalidProtobuf (an Exception, not a RuntimeError) on a damaged model: the reload is refused
    and counted, the old model keeps serving, the watcher keeps polling, and a later good checkpoint is served."""
    import onnxruntime

    import inference.engine.service

    try:
        onnxruntime.InferenceSession(b"not a model")
    except Exception as exc:  # noqa: BLE001 - the real exception object the runtime raises
        failure = exc
    assert type(failure).__name__ == "InvalidProtobuf" and not isinstance(failure, RuntimeError)
    real = inference.engine.service.load_configured
    calls = []

    def failing_once(settings):
        calls.append(settings)
        if len(calls) == 1:
            raise failure
        return real(settings)

    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = records.append
    logging.getLogger("inference.engine.reload").addHandler(handler)
    weights, config = checkpoint_copy / files.WEIGHTS, checkpoint_copy / files.CONFIG
    try:
        with make_client(checkpoint_copy, backend="torch", reload_interval_s=0.05) as c:
            monkeypatch.setattr(inference.engine.service, "load_configured", failing_once)  # the watcher's loads
            before = c.post("/predict", json={"inputs": TEXTS[1]}).json()
            config.write_text(config.read_text() + " ")  # a change whose load fails
            wait_for(lambda: c.get("/metrics").text, lambda m: 'te_model_reloads{result="failed"} 1.0' in m)
            assert c.get("/ready").status_code == 200 and c.post("/predict", json={"inputs": TEXTS[1]}).json() == before
            state = torch.load(weights, weights_only=True)
            state["classifier.bias"] = torch.tensor([0.0, 0.0, 0.0, 50.0])  # everything Sci/Tech
            save_new_weights(weights.parent, state)
            wait_for(lambda: c.get("/metrics").text, lambda m: 'te_model_reloads{result="ok"} 1.0' in m)
            assert c.post("/predict", json={"inputs": TEXTS[1]}).json()[0]["label"] == "Sci/Tech"
    finally:
        logging.getLogger("inference.engine.reload").removeHandler(handler)
    [refused] = [r.getMessage() for r in records]
    assert "Refused the new checkpoint" in refused and "InvalidProtobuf" in refused


@pytest.mark.slow  # converts a model
def test_damage_found_at_a_reload_is_named_and_the_reloaded_model_is_verified(checkpoint_copy):
    """Hot reload runs the same check: the files changed (config.json touched) while the conversion beside them was
    damaged; the reload names the damaged file, converts again, and serves a verified model."""
    with runtime_log() as lines, make_client(checkpoint_copy, reload_interval_s=0.05, **FP32) as c:
        before = c.post("/predict", json={"inputs": TEXTS[2]}).json()
        loaded = serve(checkpoint_copy, **FP32)
        cache = cache_of(checkpoint_copy, loaded)
        damaged = truncate(cache, served_folder(loaded, cache))
        config = checkpoint_copy / files.CONFIG
        config.write_text(config.read_text() + " ")
        wait_for(lambda: c.get("/metrics").text, lambda m: 'te_model_reloads{result="ok"} 1.0' in m)
        assert c.post("/predict", json={"inputs": TEXTS[2]}).json() == before
    assert any(str(damaged) in line and line.endswith("not served") for line in lines), lines
    assert cache.damage(served_folder(loaded, cache)) is None
