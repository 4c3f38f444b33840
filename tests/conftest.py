"""Shared fixtures: the project root, a hermetic environment for real CLI runs, data-file writers."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CPU_2PROC = ROOT / "accelerate_configs" / "cpu_2proc.yaml"


def pytest_configure(config):
    """Everything the suite's processes cache (Hugging Face datasets and evaluate modules, converted runtimes) goes
    to a folder of this session, never the user's ~/.cache: no test reuses what another run left there."""
    if "DISTILBERT_AGNEWS_TEST_CACHE" not in os.environ:  # set once, by the controller; xdist workers inherit it
        cache = Path(tempfile.mkdtemp(prefix="distilbert_agnews_tests_"))
        config.add_cleanup(lambda: shutil.rmtree(cache, ignore_errors=True))
        os.environ.update(
            DISTILBERT_AGNEWS_TEST_CACHE=str(cache),
            HF_HOME=str(cache / "huggingface"),
            RUNTIME_CACHE=str(cache / "runtime"),
        )


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """The folder `name`, made by `build(folder)` once per test session even when pytest-xdist runs the suite
    on several workers: the first worker to ask builds it under a file lock, the others wait and reuse it.
    A build that fails marks nothing done, so the next worker to ask tries again and reports its own failure."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the session's folder, shared
    folder, done = root / name, root / f"{name}.done"
    with FileLock(f"{folder}.lock"):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            build(folder)
            done.touch()
    return folder


@pytest.fixture(scope="session")
def smoke_dir(tmp_path_factory) -> Path:
    """Smoke assets generated once per test session, in a temporary folder (not the user's cache)."""
    from training.smoke import ensure_smoke_assets

    path = built_once(tmp_path_factory, "smoke_assets", ensure_smoke_assets)
    os.environ["DISTILBERT_AGNEWS_SMOKE_DIR"] = str(path)
    return path


# One trained model for every test that only reads one: 1 process, 1 epoch of the smoke preset (168 steps) with
# resumable states at steps 84 (mid-epoch) and 168 (the end). Tests that write into it take a copy.
# With OpenVINO installed, --export_runtime openvino: serving tests start without converting (test_runtimes.py).
SMOKE_MODEL_ARGS = ["--preset", "smoke", "--checkpointing_steps", "84", "--num_train_epochs", "1"] + (
    ["--export_runtime", "openvino"] if importlib.util.find_spec("openvino") else []
)


def trained_once(tmp_path_factory, name: str, args: list[str]) -> Path:
    """The output folder of one train.py run with `args`, trained once per test session (built_once)."""

    def train(out: Path) -> None:
        result, _ = run_train([*args, "--output_dir", str(out)])
        assert result.returncode == 0, describe(result)

    return built_once(tmp_path_factory, name, train)


@pytest.fixture(scope="session")
def smoke_model(smoke_dir, tmp_path_factory) -> Path:
    return trained_once(tmp_path_factory, "smoke_model", SMOKE_MODEL_ARGS)


# One model trained on the long-document preset (--long_text chunk, 48-token windows, 3 epochs of 202 steps), with
# resumable states every 100 steps: the long-text tests of training, prediction and the service read it.
SMOKE_LONG_ARGS = ["--preset", "smoke-long", "--checkpointing_steps", "100"]


@pytest.fixture(scope="session")
def smoke_long_model(smoke_dir, tmp_path_factory) -> Path:
    return trained_once(tmp_path_factory, "smoke_long_model", SMOKE_LONG_ARGS)


# One uninterrupted 2-process smoke run (84 batches per rank per epoch, 252 optimizer steps, a resumable state
# every 21 steps, learning rate 2e-3 x 2 processes): the end-to-end checks read it, the kill/resume tests compare
# against it.
SMOKE_2PROC_ARGS = ["--preset", "smoke", "--checkpointing_steps", "21", "--logging_steps", "21", "--scale_lr", "linear"]


@pytest.fixture(scope="session")
def smoke_2proc_run(smoke_dir, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """(output folder, the finished run with its stdout and stderr)."""

    def train(folder: Path) -> None:
        result, _ = run_train([*SMOKE_2PROC_ARGS, "--output_dir", str(folder / "out")], processes=2)
        assert result.returncode == 0, describe(result)
        (folder / "stdout.txt").write_text(result.stdout)
        (folder / "stderr.txt").write_text(result.stderr)

    folder = built_once(tmp_path_factory, "smoke_2proc", train)
    output = [(folder / name).read_text() for name in ("stdout.txt", "stderr.txt")]
    return folder / "out", subprocess.CompletedProcess(SMOKE_2PROC_ARGS, 0, *output)


def cli_env(**extra: str) -> dict[str, str]:
    """Environment for a real training process: offline, quiet, and pointing at the test's smoke assets."""
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env.update(extra)
    return env


def run_train(
    args: list[str], *, processes: int = 1, env: dict | None = None, timeout: float = 300
) -> tuple[subprocess.CompletedProcess, float]:
    """Run training/train.py as users do: plain `python` for 1 process, `accelerate launch` (gloo) for more."""
    return launch([str(ROOT / "training" / "train.py"), *args], processes=processes, env=env, timeout=timeout)


def fault_env(fault: str, **extra: str) -> dict[str, str]:
    """cli_env with a fault injected into every process of the run (tests/helpers/faults/sitecustomize.py)."""
    path = os.pathsep.join(filter(None, [str(ROOT / "tests" / "helpers" / "faults"), os.environ.get("PYTHONPATH")]))
    return cli_env(DISTILBERT_AGNEWS_FAULT=fault, PYTHONPATH=path, **extra)


def graphs_env(**extra: str) -> dict[str, str]:
    """cli_env with CUDA graphs on the CPU in every process of the run (tests/helpers/cuda_graphs/stand_in.py)."""
    path = [str(ROOT / "tests" / "helpers" / "cuda_graphs"), os.environ.get("PYTHONPATH")]
    return cli_env(PYTHONPATH=os.pathsep.join(filter(None, path)), **extra)


def launch_command(target: list[str], processes: int = 2) -> list[str]:
    """The one way the tests start N processes: `python TARGET...` for 1, else the `accelerate launch` users run,
    with the 2-process CPU config, N processes and a free port; TARGET is a script and its arguments, or
    ["-m", module, ...]."""
    if processes == 1:
        return [sys.executable, *target]
    return [
        shutil.which("accelerate", path=Path(sys.executable).parent) or "accelerate",  # this environment's
        "launch",
        "--config_file",
        str(CPU_2PROC),
        "--num_processes",
        str(processes),
        "--main_process_port",
        str(free_port()),
        *target,
    ]


def launch(
    target: list[str], *, processes: int = 1, env: dict | None = None, timeout: float = 300
) -> tuple[subprocess.CompletedProcess, float]:
    """Run launch_command(target, processes) to completion; (result, seconds)."""
    cmd = launch_command(target, processes)
    started = time.time()
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


@contextlib.contextmanager
def read_only(*folders: Path):
    """`folders` made so that nothing can be created, renamed or removed in them, even by root (the immutable
    attribute, chattr +i; chmod otherwise), for the duration of the block; a skip saying why where neither works.
    Files already inside stay writable: the code under test must not need to create any."""
    if os.geteuid() != 0:
        for folder in folders:
            folder.chmod(0o555)
        restore = [["chmod", "755", str(f)] for f in folders]
    else:
        if not shutil.which("chattr"):
            pytest.skip("running as root without chattr: no way to make a folder read-only here")
        made = subprocess.run(["chattr", "+i", *map(str, folders)], capture_output=True, text=True)
        if made.returncode != 0:
            subprocess.run(["chattr", "-i", *map(str, folders)], capture_output=True)
            pytest.skip(f"running as root and chattr +i fails here ({made.stderr.strip()}): no read-only folder")
        restore = [["chattr", "-i", *map(str, folders)]]
    try:
        yield
    finally:
        for command in restore:
            subprocess.run(command, check=True)


def write_rows(path: Path, rows: list[dict]) -> Path:
    """Write rows as csv, jsonl or parquet depending on the suffix."""
    import pandas as pd

    frame = pd.DataFrame(rows)
    if path.suffix == ".csv":
        frame.to_csv(path, index=False)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        frame.to_parquet(path)
    return path


def save_new_weights(folder: Path, state: dict) -> None:
    """New weights in a checkpoint folder as training publishes them: the state_dict by rename, then config.json
    recording their tensors' sha256 (contract/files.py: WEIGHTS_SHA256), so the pair is one consistent set."""
    import torch

    from contract import files

    weights = folder / files.WEIGHTS
    torch.save(state, weights.with_suffix(".tmp"))
    os.replace(weights.with_suffix(".tmp"), weights)
    config = json.loads((folder / files.CONFIG).read_text())
    config[files.WEIGHTS_SHA256] = {files.WEIGHTS: files.tensors_sha256(state)}
    (folder / files.CONFIG).with_suffix(".tmp").write_text(json.dumps(config))
    os.replace((folder / files.CONFIG).with_suffix(".tmp"), folder / files.CONFIG)
