"""--auto_find_batch_size on a CPU, with a stand-in out-of-memory error."""

from __future__ import annotations

import json

import pytest

from contract import files
from tests.helpers.processes import cli_env, describe, fault_env, run_train

pytestmark = pytest.mark.slow
RUN = ["--preset", "smoke", "--max_train_steps", "6", "--logging_steps", "1", "--eval_steps", "6", "--dropout", "0"]


def losses(out) -> list[float]:
    return [entry["loss"] for entry in json.loads((out / files.METRICS).read_text())["train_loss"]]


def test_a_batch_that_does_not_fit_is_halved_and_the_effective_batch_kept(smoke_dir, tmp_path):
    fitted, _ = run_train(
        [*RUN, "--per_device_train_batch_size", "24", "--auto_find_batch_size", "--output_dir", str(tmp_path / "a")],
        env=fault_env("oom_above_rows:8"),
    )
    assert fitted.returncode == 0, describe(fitted)
    assert "--auto_find_batch_size: 24 examples of" in fitted.stderr and "(tried 24, 12, 6)" in fitted.stderr
    assert "Effective batch size 24 (6 per device x 4 accumulation x 1 processes)" in fitted.stderr
    asked, _ = run_train(
        [*RUN, "--per_device_train_batch_size", "6", "--gradient_accumulation_steps", "4", "--output_dir",
         str(tmp_path / "b")],
        env=cli_env(),
    )  # fmt: skip
    assert asked.returncode == 0, describe(asked)
    assert losses(tmp_path / "a") == losses(tmp_path / "b")


def test_not_even_one_example_fitting_is_one_line(smoke_dir, tmp_path):
    result, _ = run_train(
        [*RUN, "--auto_find_batch_size", "--output_dir", str(tmp_path / "c")], env=fault_env("oom_above_rows:0")
    )
    assert result.returncode == 1, describe(result)
    assert "--auto_find_batch_size: not even 1 example of" in result.stderr and "Traceback" not in result.stderr
