"""SIGKILL: a killed 2-process run resumes bitwise."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from contract import files
from tests.conftest import SMOKE_2PROC_ARGS
from tests.helpers.files import find_latest_state
from tests.helpers.processes import ROOT, cli_env, describe, fault_env, launch_command, run_train
from training.output.resume import read_progress

pytestmark = pytest.mark.slow
SMOKE = SMOKE_2PROC_ARGS  # a resumable state every 21 optimizer steps
ACCUMULATION = ("--gradient_accumulation_steps", "2")  # 42 optimizer steps per epoch, 126 in all
RUN_ONLY = ("train_runtime_s", "throughput")  # what may differ between two runs of one configuration
CONFIG_RUN_ONLY = ("output_dir", "resume_from_checkpoint")


@pytest.fixture(scope="module")
def baselines(smoke_2proc_run, tmp_path_factory):
    """Uninterrupted runs, computed on first use: {configuration extra args: output dir}; the plain
    configuration's is the session's shared 2-process run."""
    cache: dict[tuple, Path] = {(): smoke_2proc_run[0]}

    def get(extra: tuple[str, ...]) -> Path:
        if extra not in cache:
            out = tmp_path_factory.mktemp("baseline") / "out"
            result, _ = run_train([*SMOKE, *extra, "--output_dir", str(out)], processes=2)
            assert result.returncode == 0, describe(result)
            cache[extra] = out
        return cache[extra]

    return get


def launch_in_background(out: Path, extra: tuple[str, ...], log: Path, env: dict | None = None) -> subprocess.Popen:
    cmd = launch_command([str(ROOT / "training" / "train.py"), *SMOKE, *extra, "--output_dir", str(out)])
    return subprocess.Popen(cmd, cwd=ROOT, env=env or cli_env(), stdout=open(log, "w"), stderr=subprocess.STDOUT)


def kill_9_everything(launcher: subprocess.Popen) -> None:
    """SIGKILL the launcher and every rank at once, like a machine losing power. (The ranks run in sessions
    of their own, so a process-group kill would miss them and they would train on as orphans.)"""
    import psutil  # an accelerate dependency

    family = [psutil.Process(launcher.pid), *psutil.Process(launcher.pid).children(recursive=True)]
    assert len(family) >= 3, "expected the launcher and two ranks"
    for process in family:
        process.send_signal(signal.SIGKILL)
    psutil.wait_procs(family, timeout=30)


def comparable(metrics_file: Path) -> dict:
    metrics = json.loads(metrics_file.read_text())
    for key in RUN_ONLY:
        metrics.pop(key)
    for key in CONFIG_RUN_ONLY:
        metrics["config"].pop(key)
    return metrics


def assert_same_result(resumed: Path, baseline: Path, final_step: int) -> None:
    a = load_file(baseline / files.STATE_DIR / f"step_{final_step}" / "model.safetensors")
    b = load_file(resumed / files.STATE_DIR / f"step_{final_step}" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "final weights differ"
    best_a = torch.load(baseline / files.WEIGHTS, weights_only=True)
    best_b = torch.load(resumed / files.WEIGHTS, weights_only=True)
    assert all(torch.equal(best_a[k], best_b[k]) for k in best_a), "best-model weights differ"
    assert comparable(resumed / files.METRICS) == comparable(baseline / files.METRICS)


def sigkill_after_state(out: Path, extra: tuple[str, ...], state: int, final_step: int, log: Path) -> Path:
    """Run on `out` (resuming its latest state if it has one) until state `state` is written, then SIGKILL the
    launcher and every rank; the latest state left, which must be mid-epoch and before the end."""
    resume = ("--resume_from_checkpoint", "latest") if find_latest_state(str(out)) else ()
    launcher = launch_in_background(out, (*extra, *resume), log)
    deadline = time.time() + 180
    while not (out / files.STATE_DIR / f"step_{state}" / files.PROGRESS).exists():
        assert launcher.poll() is None and time.time() < deadline, log.read_text()[-3000:]
        time.sleep(0.02)
    kill_9_everything(launcher)
    launcher.wait(30)
    latest = find_latest_state(str(out))
    progress = read_progress(latest)
    assert state <= progress.global_step < final_step, "the kill landed after the run finished"
    assert 0 < progress.batches_done, "the kill was meant to land mid-epoch"
    return latest


def resume_to_the_end(out: Path, extra: tuple[str, ...], latest: Path) -> None:
    result, _ = run_train([*SMOKE, *extra, "--output_dir", str(out), "--resume_from_checkpoint", "latest"], processes=2)
    assert result.returncode == 0, describe(result)
    assert f"Resumed from {latest}" in result.stderr, describe(result)


def test_killed_in_a_state_save_then_sigkilled_in_epoch_2_resumes_bitwise_identical(baselines, tmp_path):
    """Killed mid-publish, then mid-run: the third run ends bitwise."""
    out = tmp_path / "killed"
    env = fault_env("kill_in_save_state:42")
    result, _ = run_train([*SMOKE, *ACCUMULATION, "--output_dir", str(out)], processes=2, env=env)
    assert result.returncode != 0, describe(result)
    [staged] = (out / files.STATE_DIR).glob(".tmp_step_42.*")  # named after the run: two runs never share one
    assert staged.is_dir(), "the kill should have landed while step_42 was staged"
    assert not (out / files.STATE_DIR / "step_42").exists()
    assert find_latest_state(str(out)) == out / files.STATE_DIR / "step_21"

    latest = sigkill_after_state(out, ACCUMULATION, 63, 126, tmp_path / "resumed.log")
    assert "Resumed from" in (tmp_path / "resumed.log").read_text()
    assert not staged.exists(), "the next run on the folder removes what a dead run left half-written"
    resume_to_the_end(out, ACCUMULATION, latest)
    assert_same_result(out, baselines(ACCUMULATION), 126)


def test_kill_in_the_middle_of_a_best_model_save_keeps_the_previous_model(baselines, tmp_path):
    """The output dir already holds a servable model (a previous run's); the new run is killed while writing
    its first best model over it: the old files stay whole and loadable, byte for byte."""
    out = tmp_path / "killed_in_model_save"
    previous = baselines(())
    out.mkdir()
    for name in (files.WEIGHTS, files.CONFIG, files.METRICS):
        shutil.copy2(previous / name, out / name)
    shutil.copytree(previous / files.TOKENIZER_DIR, out / files.TOKENIZER_DIR)
    env = fault_env("kill_in_save_model:1")
    args = [*SMOKE, "--output_dir", str(out), "--checkpointing_steps", "none", "--overwrite_output_dir"]  # start over
    result, _ = run_train(args, processes=2, env=env)
    assert result.returncode != 0, describe(result)
    assert "Validation at step 84" in result.stderr, describe(result)
    assert list(out.glob(".distilbert_agnews.pt.*")), "the kill should have left a partial temporary file"
    for name in (files.WEIGHTS, files.CONFIG, files.METRICS):
        assert (out / name).read_bytes() == (previous / name).read_bytes(), name
    saved = torch.load(out / files.WEIGHTS, weights_only=True)  # and it loads
    assert saved.keys() == torch.load(previous / files.WEIGHTS, weights_only=True).keys()
