"""A new checkpoint answers at once with PyTorch fp32 while the race runs."""

from __future__ import annotations

import shutil

import pytest

import inference.engine.service
from contract import files
from tests.helpers.processes import cli_env
from tests.helpers.service import Server, assert_matches, wait_for
from tests.inference.test_app import TEXTS, make_client

pytestmark = pytest.mark.slow


def runtime(client) -> dict:
    return client.get("/info").json()["distilbert_agnews"]["runtime"]


@pytest.fixture
def new_checkpoint(checkpoint_copy, tmp_path):
    """The smoke checkpoint with nothing converted or measured for it anywhere: its runtime/ (other tests, and
    training's --export_runtime, measure into the shared copy) removed, and a RUNTIME_CACHE of its own."""
    shutil.rmtree(checkpoint_copy / files.RUNTIME_DIR, ignore_errors=True)
    return checkpoint_copy, {"runtime_cache": str(tmp_path / "runtime_cache")}


def test_a_new_checkpoint_answers_with_torch_fp32_at_once_then_the_measured_runtime(new_checkpoint, reference):
    """The measured choice replaces the provisional fp32 without a reload."""
    checkpoint_copy, cache = new_checkpoint
    with make_client(checkpoint_copy, measure_in_background=True, **cache) as client:
        first = runtime(client)
        answer = client.post("/predict", json={"inputs": TEXTS[0]})
        settled = wait_for(lambda: runtime(client), lambda r: not r.get("provisional"), timeout=180)
        after = client.post("/predict", json={"inputs": TEXTS[0]})
        info = client.get("/info").json()["distilbert_agnews"]
    assert first["provisional"] is True and (first["name"], first["precision"]) == ("torch", "fp32")
    assert answer.status_code == 200 and after.status_code == 200
    assert_matches(answer.json(), reference.probabilities(TEXTS[0]))
    assert_matches(after.json(), reference.probabilities(TEXTS[0]), tolerance=1e-4)
    assert settled["candidates"] and settled["name"] in ("openvino", "onnxruntime", "torch")
    assert info["checkpoint"]["reloads"] == 0
    assert list((checkpoint_copy / files.RUNTIME_DIR).glob(f"*/{files.RUNTIME_CHOICE}"))


def test_measuring_before_the_first_answer_stays_available(new_checkpoint):
    checkpoint_copy, cache = new_checkpoint
    with make_client(checkpoint_copy, measure_in_background=False, **cache) as client:
        measured = runtime(client)
    assert "provisional" not in measured and measured["candidates"]


def test_a_failed_background_measurement_leaves_torch_fp32_serving(new_checkpoint, monkeypatch, capfd):
    def failing(settings):
        raise RuntimeError("conversion crashed")

    monkeypatch.setattr(inference.engine.service, "load_configured", failing)
    said = []
    checkpoint_copy, cache = new_checkpoint
    with make_client(checkpoint_copy, measure_in_background=True, **cache) as client:
        wait_for(lambda: said.append(capfd.readouterr().err) or "".join(said), lambda text: "failed" in text)
        answer = client.post("/predict", json={"inputs": TEXTS[0]})
        assert runtime(client)["name"] == "torch"
    assert answer.status_code == 200
    assert "measuring in the background failed (RuntimeError: conversion crashed); torch fp32 keeps serving" in "".join(
        said
    )


def test_sigterm_during_the_background_race_exits_cleanly_and_the_next_start_measures_again(new_checkpoint):
    """SIGTERM mid-conversion drains with exit 0."""
    checkpoint_copy, cache = new_checkpoint
    env = cli_env(MEASURE_IN_BACKGROUND="true", RUNTIME_CACHE=cache["runtime_cache"])
    first = Server(checkpoint_copy, env=env).wait_ready()
    wait_for(first.output, lambda out: "Runtime: measuring" in out, timeout=60)
    first.process.terminate()
    code, output = first.exit_code(60), first.output()
    assert code == 0, output
    assert "terminate called" not in output and "abandoned at shutdown" in output, output
    second = Server(checkpoint_copy, env=env).wait_ready()
    try:
        wait_for(lambda: list((checkpoint_copy / files.RUNTIME_DIR).glob(f"*/{files.RUNTIME_CHOICE}")), bool, 180)
    finally:
        second.stop()
