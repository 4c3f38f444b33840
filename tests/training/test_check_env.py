"""`python -m training.check_env`: real 1- and 2-process checks on CPU, and each common failure's hint."""

from __future__ import annotations

import socket
import time

import pytest
import torch

from tests.helpers.processes import ROOT, cli_env, describe, free_port, launch
from training.check_env import node_problems

CONFIGS = ROOT / "accelerate_configs"


def check_env(*args: str, env: dict | None = None):
    return launch(["-m", "training.check_env", *args], env=env)


def test_one_process_reports_versions_and_runs_a_one_process_gloo_group():
    result, _ = check_env()
    assert result.returncode == 0, describe(result)
    for package in ("torch", "accelerate", "transformers", "datasets"):
        assert f"{package} " in result.stdout
    assert "WORLD_SIZE=-" in result.stdout  # no launcher variables
    assert "One-process gloo group on cpu: init and all-reduce OK" in result.stdout


@pytest.mark.slow
def test_two_processes_under_accelerate_launch_all_reduce_and_measure_bandwidth():
    result, _ = launch(["-m", "training.check_env", "--buffer_mb", "4"], processes=2)
    assert result.returncode == 0, describe(result)
    for rank in (0, 1):
        assert f"[rank {rank}/2 on {socket.gethostname()}]" in result.stdout
        assert f"RANK={rank} LOCAL_RANK={rank} WORLD_SIZE=2" in result.stdout
    assert "process group MULTI_CPU over gloo" in result.stdout
    assert "all-reduce OK: 2 process(es) on 1 machine(s), sum 3 == 3; 4 MB all-reduce" in result.stdout
    assert "bus bandwidth" in result.stdout


@pytest.mark.slow
def test_num_processes_checks_then_launches_itself():
    result, _ = check_env("--num_processes", "2", "--main_process_port", str(free_port()), "--buffer_mb", "1")
    assert result.returncode == 0, describe(result)
    assert "Launching: " in result.stdout and "sum 3 == 3" in result.stdout


def test_a_port_in_use_fails_before_launching_with_a_hint():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result, _ = check_env("--num_processes", "2", "--main_process_port", str(port))
    assert result.returncode == 1, describe(result)
    assert f"Port {port} is already in use" in result.stdout and "--main_process_port" in result.stdout
    assert "Launching" not in result.stdout and "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize("config", ["kaggle_2xt4.yaml", "multi_gpu.yaml"])
def test_a_gpu_config_on_a_machine_without_gpus_is_refused_before_launching(config):
    """The Kaggle notebook's check passed on a CPU with the 2xT4 config, and training then failed in a child's
    traceback."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the config is for it")
    result, _ = check_env("--num_processes", "2", "--main_process_port", "0", "--config_file", f"{CONFIGS}/{config}")
    assert result.returncode == 1 and "Launching" not in result.stdout, describe(result)
    [line] = [line for line in result.stdout.splitlines() if "asks for GPUs" in line]
    assert line.endswith("use accelerate_configs/cpu_2proc.yaml (the Kaggle notebook: AGNEWS_NOTEBOOK_SMOKE=1).")


def rank0_env(port: int) -> dict:
    return dict(
        cli_env(),
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="2",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )


def test_a_rendezvous_port_in_use_is_named():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result, _ = check_env("--timeout", "5", env=rank0_env(taken.getsockname()[1]))
    assert result.returncode == 1, describe(result)
    assert "Cannot open or reach the rendezvous" in result.stdout and "EADDRINUSE" in result.stdout
    assert "Traceback" not in result.stderr


def test_a_world_that_never_assembles_ends_after_the_timeout_with_a_hint():
    # Rank 0 of a 2-process world whose rank 1 never comes: what a node started with a different
    # num_processes/num_machines, or not started at all, looks like from the first node.
    started = time.time()
    result, _ = check_env("--timeout", "4", env=rank0_env(free_port()))
    assert result.returncode == 1, describe(result)
    assert "The group of WORLD_SIZE=2 processes did not assemble within 4 s" in result.stdout
    assert "1/2 clients joined" in result.stdout
    assert time.time() - started < 60


def test_gpu_and_nccl_hints():
    # The decision logic, with the GPU facts passed in: this machine has no GPU to reproduce them for real.
    few = node_problems(processes_on_node=2, gpu_count=1, cuda=True, nccl=True)
    assert len(few) == 1 and "2 processes on this node but only 1 GPU(s) visible" in few[0]
    no_nccl = node_problems(processes_on_node=2, gpu_count=2, cuda=True, nccl=False)
    assert len(no_nccl) == 1 and "no NCCL" in no_nccl[0]
    assert node_problems(processes_on_node=2, gpu_count=2, cuda=True, nccl=True) == []
    assert node_problems(processes_on_node=4, gpu_count=0, cuda=False, nccl=False) == []  # CPU: gloo, any count
