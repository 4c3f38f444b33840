"""Faults with real processes: SIGTERM to the launcher (preemption), a diverging loss, bad data on 2 ranks."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest
import torch

from contract import files
from tests.helpers.files import find_latest_state, write_rows
from tests.helpers.processes import ROOT, cli_env, describe, fault_env, launch_command, run_train
from training.output.resume import read_progress

pytestmark = pytest.mark.slow
SMOKE = ["--preset", "smoke", "--stop_check_steps", "5", "--logging_steps", "10", "--keep_states"]


def test_sigterm_to_the_launcher_saves_a_resumable_state_and_resume_completes(smoke_dir, tmp_path):
    out = tmp_path / "preempted"
    log = tmp_path / "launch.log"
    cmd = launch_command(
        [str(ROOT / "training" / "train.py"), *SMOKE, "--output_dir", str(out), "--checkpointing_steps", "none"]
    )
    with open(log, "w") as fh:
        launcher = subprocess.Popen(cmd, cwd=ROOT, env=cli_env(), stdout=fh, stderr=subprocess.STDOUT)
        deadline = time.time() + 180
        while "step 100 " not in log.read_text():  # well into epoch 2 (84 steps per epoch)
            assert launcher.poll() is None and time.time() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        signalled = time.time()
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(60)
    assert time.time() - signalled < 60
    output = log.read_text()
    assert "SIGTERM: stopped at step" in output, output[-3000:]
    state = find_latest_state(str(out))
    assert state is not None
    progress = read_progress(state)
    assert 100 <= progress.global_step < 252 and progress.epoch == 1 and progress.batches_done > 0
    assert not (out / files.METRICS).exists() or json.loads((out / files.METRICS).read_text())["test"] is None

    result, _ = run_train(
        [*SMOKE, "--output_dir", str(out), "--checkpointing_steps", "none", "--resume_from_checkpoint", "latest"],
        processes=2,
    )
    assert result.returncode == 0, describe(result)
    metrics = json.loads((out / files.METRICS).read_text())
    assert metrics["global_step"] == 252 and metrics["epochs_completed"] == 3 and metrics["test"]["num_examples"] == 600


def test_a_diverging_loss_stops_every_rank_and_keeps_the_saved_model(smoke_dir, tmp_path):
    out = tmp_path / "diverged"
    env = fault_env("nan_loss_from_step:100")
    started = time.time()
    result, _ = run_train([*SMOKE, "--output_dir", str(out), "--max_nonfinite_steps", "3"], processes=2, env=env)
    assert result.returncode != 0 and time.time() - started < 120
    assert "The loss was not finite for 3 consecutive batches" in result.stderr, describe(result)
    metrics = json.loads((out / files.METRICS).read_text())
    assert metrics["best_step"] == 84  # saved at the end of epoch 1, before the fault
    weights = torch.load(out / files.WEIGHTS, weights_only=True)
    assert all(torch.isfinite(v).all() for v in weights.values() if v.is_floating_point())
    assert [p.name for p in (out / files.STATE_DIR).iterdir()] == ["step_84"]  # nothing saved after the divergence


def test_bad_data_stops_both_ranks_fast_with_file_and_row(smoke_dir, tmp_path):
    rows = [{"text": f"news item {i}", "label": i % 4} for i in range(100)] + [{"text": "odd", "label": None}]
    train = write_rows(tmp_path / "bad.csv", rows)
    started = time.time()
    result, _ = run_train(
        [
            "--preset",
            "smoke",
            "--model_name_or_path",
            str(smoke_dir / "model"),
            "--train_file",
            str(train),
            "--output_dir",
            str(tmp_path / "o"),
            "--label_names",
            "World",
            "Sports",
            "Business",
            "Sci/Tech",
        ],
        processes=2,
    )
    assert result.returncode == 1 and time.time() - started < 30 + 15  # 30 s plus the launcher's start-up
    assert "bad.csv: row 101: label None is not a class" in result.stderr, describe(result)
    # One line from the main process; no rank prints a traceback (the launcher still prints its own summary).
    assert result.stderr.count("label None is not a class") == 1, describe(result)
    assert "[rank0]: Traceback" not in result.stderr and "[rank1]: Traceback" not in result.stderr


def test_an_exception_on_one_rank_ends_the_whole_job(smoke_dir, tmp_path):
    """Rank 1 raises after step 30; rank 0 is left in a collective. The launcher sees rank 1 die and ends the job."""
    env = fault_env("raise_on_rank:1:30")
    started = time.time()
    result, _ = run_train(
        [*SMOKE, "--output_dir", str(tmp_path / "o"), "--ddp_timeout", "60"], processes=2, env=env, timeout=240
    )
    elapsed = time.time() - started
    assert result.returncode != 0, describe(result)
    assert "injected fault" in result.stderr and "rank 1 failed after optimizer step 30" in result.stderr
    assert elapsed < 60 + 45, f"took {elapsed:.0f} s"  # bounded: ddp_timeout plus start-up and teardown


def test_a_hung_rank_ends_the_whole_job_after_ddp_timeout(smoke_dir, tmp_path):
    """A hung rank: the collective times out and the launcher ends the job."""
    env = fault_env("hang_on_rank:1:30")
    started = time.time()
    result, _ = run_train(
        [*SMOKE, "--output_dir", str(tmp_path / "o"), "--ddp_timeout", "10"], processes=2, env=env, timeout=300
    )
    elapsed = time.time() - started
    assert result.returncode != 0, describe(result)
    assert 10 <= elapsed < 10 + 30 + 60, f"took {elapsed:.0f} s"  # timeout + elastic's SIGKILL grace + start-up
    assert "timed out" in result.stderr.lower() or "timeout" in result.stderr.lower(), describe(result)
