"""`pip install ".[serve]"` alone runs the service (SERVE_ONLY_PYTHON, from .ci/run)."""

from __future__ import annotations

import os
import subprocess

import httpx
import pytest

from contract import precision
from tests.helpers.processes import cli_env
from tests.helpers.service import Server

pytestmark = pytest.mark.slow
PYTHON = os.environ.get("SERVE_ONLY_PYTHON")


@pytest.mark.skipif(
    not PYTHON,
    reason="SERVE_ONLY_PYTHON is not set: no serve-only environment to test "
    "(.ci/run builds one with pip install '.[serve]')",
)
def test_the_service_runs_from_a_serve_only_install(smoke_checkpoint):
    for training_only in ("datasets", "accelerate", "matplotlib", "openvino", "onnxruntime"):
        probe = subprocess.run(
            [PYTHON, "-c", f"import {training_only}"], capture_output=True, text=True, cwd="/", timeout=60
        )
        assert probe.returncode != 0, f"{training_only} is importable in the serve-only environment"
    auto = precision.resolve(precision.AUTO, "cpu")  # bf16 on a CPU with AVX512-BF16 or AMX, else fp32
    env = cli_env()
    env.pop("PYTHONPATH", None)
    server = Server(smoke_checkpoint, "--reload_interval_s", "0", python=PYTHON, env=env).wait_ready()
    try:
        answer = httpx.post(f"{server.url}/predict", json={"inputs": "The yankees beat the red sox."})
        assert answer.status_code == 200 and answer.json()[0]["label"] == "Sports"
        runtime = httpx.get(f"{server.url}/info").json()["distilbert_agnews"]["runtime"]
        assert (runtime["name"], runtime["precision"]) == ("torch", auto)
    finally:
        log = server.stop()
    # BACKEND=auto without the optimized runtime: today's path, said in one line
    assert f"Runtime: torch {auto} (BACKEND=auto: no optimized CPU runtime is installed" in log, log


@pytest.mark.skipif(not PYTHON, reason="SERVE_ONLY_PYTHON is not set: no serve-only environment to test")
def test_a_training_command_in_a_serve_only_install_names_the_extra_in_one_line(tmp_path):
    """`agnews train` there ended in a ModuleNotFoundError traceback."""
    from pathlib import Path

    agnews = Path(PYTHON).parent / "agnews"
    done = subprocess.run([str(agnews), "train", "--preset", "smoke"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == (
        "agnews train: needs accelerate, which this install lacks: pip install 'distilbert-agnews[train]'"
    )
