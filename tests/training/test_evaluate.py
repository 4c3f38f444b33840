"""`python -m training.evaluate`: one saved model scored with 1, 2 and 3 processes gives identical metrics."""

from __future__ import annotations

import json
import math

import pytest

from tests.conftest import describe, launch, run_train

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(smoke_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("evaluate") / "out"
    result, _ = run_train(["--preset", "smoke", "--output_dir", str(out), "--checkpointing_steps", "none"])
    assert result.returncode == 0, describe(result)
    return out


def evaluate_with(processes: int, out) -> dict:
    result, _ = launch(["-m", "training.evaluate", "--checkpoint_dir", str(out), "--preset", "smoke",
                        "--per_device_eval_batch_size", "64"], processes=processes)
    assert result.returncode == 0, describe(result)
    saved = json.loads((out / "eval_results.json").read_text())
    assert saved["world_size"] == processes
    return saved["metrics"]


def test_metrics_are_identical_with_1_2_and_3_processes(trained, smoke_dir):
    rows = sum(1 for _ in open(smoke_dir / "test.csv", encoding="utf-8")) - 1
    batches = math.ceil(rows / 64)
    assert batches % 3 and rows % 64, "the 3-process case must end on an uneven, partial batch"
    one, two, three = (evaluate_with(n, trained) for n in (1, 2, 3))
    assert one["num_examples"] == rows  # accelerate's padding duplicates are dropped, nothing is lost
    assert one == two == three  # exact: same counts, same float loss
    # The training run's own test score of the same weights. Training evaluates with its CPU training
    # attention (eager), the CLI with the inference default (SDPA): the same counts, and the mean loss
    # equal up to float32 rounding of the two kernels (bitwise on some CPUs, not on others).
    trained_test = json.loads((trained / "metrics.json").read_text())["test"]
    assert {k: v for k, v in one.items() if k != "loss"} == {k: v for k, v in trained_test.items() if k != "loss"}
    assert one["loss"] == pytest.approx(trained_test["loss"], rel=1e-5)


def test_a_missing_checkpoint_is_one_line_and_exit_1(tmp_path):
    result, seconds = launch(["-m", "training.evaluate", "--checkpoint_dir", str(tmp_path), "--preset", "smoke"])
    assert result.returncode == 1, describe(result)
    assert "distilbert_agnews.pt: missing" in result.stderr and "Traceback" not in result.stderr
