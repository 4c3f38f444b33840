"""What a run says when its numbers cannot be trusted."""

from __future__ import annotations

import json

import pytest

from contract import files
from tests.helpers.processes import describe, run_train

pytestmark = pytest.mark.slow


def test_a_tiny_validation_split_and_a_model_that_learned_nothing_are_said(smoke_dir, tmp_path):
    """200 training rows: the default 5 % holds out 10 texts. A learning rate of 1e-9 leaves the random head as it
    is: it picks the same class for every text (or never some)."""
    rows = (smoke_dir / "train.csv").read_text().splitlines()
    data = tmp_path / "small.csv"
    data.write_text("\n".join(rows[:201]) + "\n")
    out = tmp_path / "out"
    args = ["--preset", "smoke", "--model_name_or_path", str(smoke_dir / "model"), "--train_file", str(data)]
    args += ["--validation_split", "0.05", "--output_dir", str(out)]
    result, _ = run_train([*args, "--learning_rate", "1e-9", "--num_train_epochs", "1"])
    assert result.returncode == 0, describe(result)
    warnings = [line for line in result.stderr.splitlines() if " WARNING " in line]
    thin = [line for line in warnings if "the validation split has 10 texts" in line]
    assert len(thin) == 1 and "--validation_split (now 0.05)" in thin[0], warnings
    one_sided = [line for line in warnings if "predicts some labels for every validation text or for none" in line]
    assert len(one_sided) == 1 and "--class_weights balanced" in one_sided[0], warnings
    recorded = json.loads((out / files.METRICS).read_text())["one_sided_labels"]
    assert recorded.get("never"), recorded
    assert one_sided[0].count(recorded["never"][0]) == 1
