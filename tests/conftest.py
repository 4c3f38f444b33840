"""Shared fixtures: the test session's caches, and the smoke assets and models trained once per session and read by
many tests. The helpers tests call live in tests/helpers/ (processes.py: real CLI runs; files.py: data files,
read-only folders)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.processes import describe, run_train
from tests.helpers.service import Reference


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
    """The folder `name`, built once per session under a file lock across xdist workers."""
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


# One smoke model (1 epoch, states at steps 84 and 168) for tests that only read it; its OpenVINO export lets the
# serving tests start without converting. Runs that only train alike (the output folder's tests) leave it out.
SMOKE_TRAINING = ["--preset", "smoke", "--checkpointing_steps", "84", "--num_train_epochs", "1", "--keep_states"]
SMOKE_MODEL_ARGS = SMOKE_TRAINING + (["--export_runtime", "openvino"] if importlib.util.find_spec("openvino") else [])


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
SMOKE_LONG_ARGS = ["--preset", "smoke-long", "--checkpointing_steps", "100", "--keep_states"]


@pytest.fixture(scope="session")
def smoke_long_model(smoke_dir, tmp_path_factory) -> Path:
    return trained_once(tmp_path_factory, "smoke_long_model", SMOKE_LONG_ARGS)


# One uninterrupted 2-process smoke run (84 batches per rank per epoch, 252 optimizer steps, a resumable state
# every 21 steps, learning rate 2e-3 x 2 processes): the end-to-end checks read it, the kill/resume tests compare
# against it.
SMOKE_2PROC_ARGS = [
    *("--preset", "smoke", "--checkpointing_steps", "21", "--logging_steps", "21", "--scale_lr", "linear"),
    "--keep_states",
]


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


@pytest.fixture(scope="session")
def smoke_checkpoint(smoke_model) -> Path:
    """The session's smoke model; tests that change files use checkpoint_copy."""
    return smoke_model


@pytest.fixture
def checkpoint_copy(smoke_checkpoint, tmp_path) -> Path:
    """A private copy a test may overwrite (reload, corruption)."""
    return Path(shutil.copytree(smoke_checkpoint, tmp_path / "ckpt"))


@pytest.fixture(scope="session")
def reference(smoke_checkpoint) -> Reference:
    return Reference(smoke_checkpoint)
