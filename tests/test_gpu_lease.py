"""bench/gpu_lease.py cannot rot between GPU leases: its --dry-run runs the stages on CPU with tiny shapes (the
GEMM, the one-process group, the bf16 smoke run, the sync-debug run, the training bench) and prints the block."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT, cli_env

pytestmark = pytest.mark.slow


def test_the_lease_script_dry_run_prints_one_block_with_every_stage(smoke_dir, tmp_path):
    out = tmp_path / "lease"
    command = [sys.executable, "bench/gpu_lease.py", "--dry-run", "--stage", "env", "smoke", "train", "--out", str(out)]
    result = subprocess.run(command, cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    command = [sys.executable, "bench/gpu_lease.py", "--report", "--out", str(out)]
    block = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60).stdout
    print(block)
    assert block.startswith("### GPU lease") and "torch 2." in block and "commit " in block
    assert "| GEMM 256^3 float32 |" in block and "TFLOP/s" in block
    assert "| torchrun world size 1, training.check_env | exit 0" in block
    assert "| smoke, bf16 | exit 0" in block and "test accuracy" in block
    assert "set_sync_debug_mode('error') | exit 0: train.py exit 0: CPU: no CUDA sync to check" in block
    assert "**tiny, batch 8, 1 epoch(s)" in block and "| trainer |" in block
    assert (
        "#### scale\n\nnot run" in block and "#### minilm\n\nnot run" in block and "#### serve\n\nnot run" in block
    )  # stages run one by one
