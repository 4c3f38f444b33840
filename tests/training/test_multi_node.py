"""Multi-node on one machine: the SLURM script with stand-ins for srun and scontrol."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from contract import files
from tests.helpers.processes import ROOT, cli_env, free_port

pytestmark = pytest.mark.slow

SBATCH = ROOT / "scripts" / "slurm_multi_node.sbatch"


ARGS = ["--preset", "smoke", "--num_train_epochs", "3", "--checkpointing_steps", "42", "--keep_states"]  # 84/epoch


def slurm_env(logs: Path) -> dict[str, str]:
    return cli_env(
        PATH=os.pathsep.join([str(ROOT / "tests" / "helpers" / "fake_slurm"), os.environ["PATH"]]),
        SLURM_NNODES="2",
        SLURM_JOB_NODELIST="node[0-1]",
        SLURM_JOB_ID="4242",
        SLURM_SUBMIT_DIR=str(ROOT),
        GPUS_PER_NODE="1",
        MAIN_PROCESS_PORT=str(free_port()),
        FAKE_SLURM_LOGS=str(logs),
    )


def start(out: Path, logs: Path) -> subprocess.Popen:
    """The batch script, as SLURM starts it on the first node of the allocation."""
    return subprocess.Popen(
        ["bash", str(SBATCH), *ARGS, "--output_dir", str(out)],
        env=slurm_env(logs),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(job: subprocess.Popen, logs: Path) -> str:
    output = job.communicate(timeout=300)[0]
    node_logs = "\n".join((logs / f"node{n}.log").read_text() for n in (0, 1))
    assert job.returncode == 0, f"{output}\n{node_logs[-6000:]}"
    return output


@pytest.fixture(scope="module")
def uninterrupted(smoke_dir, tmp_path_factory) -> tuple[Path, Path]:
    out, logs = tmp_path_factory.mktemp("slurm") / "out", tmp_path_factory.mktemp("logs")
    output = finish(start(out, logs), logs)
    assert "nodes 2 x 1 processes, rendezvous 127.0.0.1:" in output
    return out, logs


def test_two_machines_train_the_smoke_preset_into_one_checkpoint(uninterrupted):
    out, logs = uninterrupted
    node_logs = {n: (logs / f"node{n}.log").read_text() for n in (0, 1)}
    assert "MULTI_CPU, 2 process(es)" in node_logs[0]  # one group across both launchers, over gloo
    assert "Test (best model" in node_logs[0] and "Test (best model" not in node_logs[1]  # the main process logs
    assert "Training: 100%" in node_logs[1]  # machine 1 trained its share: its local main shows the bar
    assert "No resumable state" in node_logs[0]  # every start asks for `latest`; the first finds none
    summary = json.loads((out / files.METRICS).read_text())
    assert summary["world_size"] == 2 and summary["test"]["num_examples"] == 600
    written = sorted(p.name for p in out.iterdir())
    assert written.count(files.WEIGHTS) == 1 and not any(name.endswith(".tmp") for name in written)


def test_a_job_warned_by_sigterm_saves_is_requeued_and_ends_as_if_never_stopped(uninterrupted, tmp_path):
    """SIGTERM before the time limit: saved, requeued, finished bitwise."""
    out, logs = tmp_path / "out", tmp_path / "logs"
    logs.mkdir()
    job = start(out, logs)
    deadline = time.time() + 240
    while not (out / files.STATE_DIR / "step_42").is_dir() and job.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    job.send_signal(signal.SIGTERM)
    output = finish(job, logs)
    assert "SIGTERM: saving a resumable state" in output and "requeueing job 4242" in output, output
    assert (logs / "requeued").read_text().split() == ["4242"]
    assert not (out / files.METRICS).exists()  # stopped before the end
    finish(start(out, logs), logs)  # SLURM starts the requeued job again
    node0 = (logs / "node0.log").read_text()
    assert "SIGTERM: stopped at step" in node0 and "Resumed from" in node0
    reference = uninterrupted[0]
    a, b = (torch.load(folder / files.WEIGHTS, weights_only=True) for folder in (reference, out))
    assert all(torch.equal(a[k], b[k]) for k in a)
    last = f"{files.STATE_DIR}/step_252/model.safetensors"
    x, y = load_file(reference / last), load_file(out / last)
    assert all(torch.equal(x[k], y[k]) for k in x)
