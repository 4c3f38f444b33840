"""Real processes as the tests start them: a hermetic environment (offline, quiet, the test's smoke assets), the one
way to launch 1 or N processes (`accelerate launch` over gloo), and the tail of a failed run for assertion messages."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import warm

ROOT = Path(__file__).resolve().parent.parent.parent
CPU_2PROC = ROOT / "accelerate_configs" / "cpu_2proc.yaml"
FSDP = ROOT / "accelerate_configs" / "fsdp.yaml"  # with fsdp_env: FSDP2 on gloo (tests/helpers/fsdp)


def cli_env(**extra: str) -> dict[str, str]:
    """Environment for a real training process: offline, quiet, and pointing at the test's smoke assets."""
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env.update(extra)
    return env


def run_train(
    args: list[str],
    *,
    processes: int = 1,
    env: dict | None = None,
    timeout: float = 300,
    config: Path = CPU_2PROC,
    keep_states: bool = True,
) -> tuple[subprocess.CompletedProcess, float]:
    """Run training/train.py as users do: plain `python` for 1 process, `accelerate launch` (gloo) for more. The
    resumable states stay after the run (--keep_states) for the tests that resume, damage or compare them; a test of
    what a finished run removes passes keep_states=False."""
    target = [str(ROOT / "training" / "train.py"), *args, *(["--keep_states"] if keep_states else [])]
    return launch(target, processes=processes, env=env, timeout=timeout, config=config)


def fault_env(fault: str, **extra: str) -> dict[str, str]:
    """cli_env with a fault injected into every process of the run (tests/helpers/faults/sitecustomize.py)."""
    path = os.pathsep.join(filter(None, [str(ROOT / "tests" / "helpers" / "faults"), os.environ.get("PYTHONPATH")]))
    return cli_env(DISTILBERT_AGNEWS_FAULT=fault, PYTHONPATH=path, **extra)


def fsdp_env(**extra: str) -> dict[str, str]:
    """cli_env with FSDP2 on gloo in every process launched with FSDP (tests/helpers/fsdp/sitecustomize.py)."""
    path = [str(ROOT / "tests" / "helpers" / "fsdp"), os.environ.get("PYTHONPATH")]
    return cli_env(PYTHONPATH=os.pathsep.join(filter(None, path)), **extra)


def graphs_env(**extra: str) -> dict[str, str]:
    """cli_env with CUDA graphs on the CPU in every process of the run (tests/helpers/cuda_graphs/stand_in.py)."""
    path = [str(ROOT / "tests" / "helpers" / "cuda_graphs"), os.environ.get("PYTHONPATH")]
    return cli_env(PYTHONPATH=os.pathsep.join(filter(None, path)), **extra)


def train_under_graphs(out: Path, args: list[str]) -> dict:
    """train.py writing `out` with CUDA graphs stood in for on the CPU (graphs_env); its metrics.json. A whole-step
    run must have captured (the stand-in's count, printed at exit)."""
    from contract import files
    from tests.helpers.cuda_graphs.stand_in import STEP_REPORT

    result, _ = run_train([*args, "--output_dir", str(out)], env=graphs_env())
    assert result.returncode == 0, describe(result)
    if "whole-step" in args:
        assert int(result.stderr.rpartition(f"{STEP_REPORT}: ")[2].split()[0]) > 0, describe(result)
    return json.loads((out / files.METRICS).read_text())


def launch_command(target: list[str], processes: int = 2, config: Path = CPU_2PROC) -> list[str]:
    """N processes as users start them: python for 1, accelerate launch for more."""
    if processes == 1:
        return [sys.executable, *target]
    return [
        shutil.which("accelerate", path=Path(sys.executable).parent) or "accelerate",  # this environment's
        "launch",
        "--config_file",
        str(config),
        "--num_processes",
        str(processes),
        "--main_process_port",
        str(free_port()),
        *target,
    ]


def launch(
    target: list[str], *, processes: int = 1, env: dict | None = None, timeout: float = 300, config: Path = CPU_2PROC
) -> tuple[subprocess.CompletedProcess, float]:
    """Run launch_command(target, processes, config) to completion; (result, seconds). One process in the plain
    test environment forks from a warm interpreter (tests/helpers/warm.py); any other run starts cold."""
    cmd = launch_command(target, processes, config)
    started = time.time()
    if processes == 1 and env is None and sys.platform == "linux":  # macOS forks badly after its frameworks load
        return warm.run(cmd, target, cli_env(), ROOT, timeout), time.time() - started
    result = subprocess.run(cmd, cwd=ROOT, env=env or cli_env(), capture_output=True, text=True, timeout=timeout)
    return result, time.time() - started


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def describe(result: subprocess.CompletedProcess) -> str:
    """The tail of a failed run's output, for assertion messages."""
    return f"exit {result.returncode}\n--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-6000:]}"
