"""bench/gpu_lease.py cannot rot between GPU leases: its --dry-run runs the stages on CPU with tiny shapes (the
GEMM, the one-process group, the bf16 smoke run, the eager and captured sync-debug runs, the training bench) and
prints the block; a call whose inputs are missing stops in one line before running anything."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from tests.helpers.processes import ROOT, cli_env


def lease_module():
    spec = importlib.util.spec_from_file_location("gpu_lease", ROOT / "bench" / "gpu_lease.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_lease_script_dry_run_prints_one_block_with_every_stage(smoke_dir, tmp_path):
    out = tmp_path / "lease"
    command = [sys.executable, "bench/gpu_lease.py", "--dry-run", "--stage", "env", "smoke", "train", "--out", str(out)]
    result = subprocess.run(command, cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    command = [sys.executable, "bench/gpu_lease.py", "--report", "--out", str(out)]
    block = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60).stdout
    print(block)
    assert block.startswith("### GPU lease") and "torch 2." in block and "commit " in block
    assert "| GEMM 256^3 float32 |" in block and "TFLOP/s" in block
    assert "| torchrun world size 1, training.check_env | exit 0" in block
    assert "| smoke, bf16 | exit 0" in block and "test accuracy" in block
    for run in ("eager", "captured"):
        assert (
            f"| 20 steps ({run}), steady steps under set_sync_debug_mode('error') | exit 0: train.py exit 0: "
            "CPU: no CUDA sync to check" in block
        )
    assert "**tiny, batch 8, 1 epoch(s)" in block and "| trainer |" in block
    assert (
        "#### scale\n\nnot run" in block and "#### minilm\n\nnot run" in block and "#### serve\n\nnot run" in block
    )  # stages run one by one


def test_the_four_calls_cover_every_stage_once():
    lease = lease_module()
    stages = [stage for call in lease.CALLS for stage in call]
    assert sorted(stages) == sorted(lease.STAGES) and len(lease.CALLS) == 4


def test_a_call_names_every_missing_input_before_running(monkeypatch):
    lease = lease_module()
    assert lease.missing_inputs(("env", "smoke"), {}, dry=False) == []  # this suite's environment has the modules
    missing = lease.missing_inputs(("minilm",), {}, dry=False)  # without .lease/
    assert missing == ["the AG News rows (.lease/, from --pack)", "the MiniLM (.lease/minilm_bf16, from --pack)"]
    assert lease.missing_inputs(lease.CALLS[0], {}, dry=True) == []  # a dry run makes its own data
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "fastapi" else real_find_spec(name))
    assert lease.missing_inputs(("serve",), {"BENCH_AG_NEWS": "x"}, dry=False) == [
        "module fastapi (carry .whl/ from --pack)"
    ]


def test_the_carried_wheels_install_only_what_is_missing_or_older(tmp_path, monkeypatch):
    lease = lease_module()
    wheels = tmp_path / ".whl"
    wheels.mkdir()
    from importlib.metadata import version

    fastapi = version("fastapi")
    for name in (f"fastapi-{fastapi}-py3-none-any.whl", "fastapi_twin_not_installed-1.0-py3-none-any.whl"):
        (wheels / name).write_bytes(b"")
    (wheels / "starlette-0.0.1-py3-none-any.whl").write_bytes(b"")  # older than the one installed here
    commands = []
    monkeypatch.setattr(lease, "WHEELS_DIR", wheels)
    monkeypatch.setattr(lease.subprocess, "run", lambda command, check: commands.append(command))
    lease.install_wheels()
    assert len(commands) == 1
    assert [c.rsplit("/", 1)[-1] for c in commands[0] if c.endswith(".whl")] == [
        "fastapi_twin_not_installed-1.0-py3-none-any.whl"
    ]
