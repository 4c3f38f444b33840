"""Multi-node as far as one machine allows: scripts/slurm_multi_node.sbatch run with stand-ins for srun and
scontrol (tests/helpers/fake_slurm) starts two `accelerate launch` invocations of the shipped
accelerate_configs/multi_node.yaml, num_machines 2, machine ranks 0 and 1 from SLURM_NODEID, rendezvous on
127.0.0.1 over gloo; they train the smoke preset to completion and produce one checkpoint."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from contract import files
from tests.helpers.processes import ROOT, cli_env, free_port

pytestmark = pytest.mark.slow

SBATCH = ROOT / "scripts" / "slurm_multi_node.sbatch"


def test_two_machines_train_the_smoke_preset_into_one_checkpoint(smoke_dir, tmp_path):
    out, logs = tmp_path / "out", tmp_path / "logs"
    logs.mkdir()
    env = cli_env(
        PATH=os.pathsep.join([str(ROOT / "tests" / "helpers" / "fake_slurm"), os.environ["PATH"]]),
        SLURM_NNODES="2",
        SLURM_JOB_NODELIST="node[0-1]",
        SLURM_SUBMIT_DIR=str(ROOT),
        GPUS_PER_NODE="1",
        MAIN_PROCESS_PORT=str(free_port()),
        FAKE_SLURM_LOGS=str(logs),
    )
    result = subprocess.run(
        ["bash", str(SBATCH), "--preset", "smoke", "--num_train_epochs", "1", "--output_dir", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    node_logs = {n: (logs / f"node{n}.log").read_text() for n in (0, 1)}
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n" + "\n".join(node_logs.values())[-6000:]
    assert "nodes 2 x 1 processes, rendezvous 127.0.0.1:" in result.stdout
    assert "MULTI_CPU, 2 process(es)" in node_logs[0]  # one group across both launchers, over gloo
    assert "Test (best model" in node_logs[0] and "Test (best model" not in node_logs[1]  # the main process logs
    assert "Training: 100%" in node_logs[1]  # machine 1 trained its share: its local main shows the bar
    summary = json.loads((out / files.METRICS).read_text())
    assert summary["world_size"] == 2 and summary["test"]["num_examples"] == 600
    written = sorted(p.name for p in out.iterdir())
    assert written.count(files.WEIGHTS) == 1 and not any(name.endswith(".tmp") for name in written)
