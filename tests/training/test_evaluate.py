"""`python -m training.evaluate`: one saved model scored with 1, 2 and 3 processes gives identical metrics; the
results name the weights they describe, and weights replaced mid-evaluation write none."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from contract import files
from tests.helpers.processes import describe, launch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(smoke_model, tmp_path_factory):
    """A copy of the session's trained smoke model: evaluation writes its reports into the folder."""
    return Path(shutil.copytree(smoke_model, tmp_path_factory.mktemp("evaluate") / "out"))


def evaluate_with(processes: int, out) -> dict:
    result, _ = launch(
        [
            "-m",
            "training.evaluate",
            "--checkpoint_dir",
            str(out),
            "--preset",
            "smoke",
            "--per_device_eval_batch_size",
            "64",
        ],
        processes=processes,
    )
    assert result.returncode == 0, describe(result)
    saved = json.loads((out / files.EVAL_RESULTS).read_text())
    assert saved["world_size"] == processes
    saved[files.MISCLASSIFIED_CSV] = (out / files.MISCLASSIFIED_CSV).read_bytes()
    saved["stdout"] = result.stdout + result.stderr
    return saved


@pytest.fixture(scope="module")
def evaluations(trained):
    return {n: evaluate_with(n, trained) for n in (1, 2, 3)}


def test_metrics_are_identical_with_1_2_and_3_processes(trained, smoke_dir, evaluations):
    rows = sum(1 for _ in open(smoke_dir / "test.csv", encoding="utf-8")) - 1
    batches = math.ceil(rows / 64)
    assert batches % 3 and rows % 64, "the 3-process case must end on an uneven, partial batch"
    one, two, three = (evaluations[n]["metrics"] for n in (1, 2, 3))
    assert one["num_examples"] == rows  # accelerate's padding duplicates are dropped, nothing is lost
    assert one == two == three  # exact: same counts, same float loss
    # Training's own test score: the same counts and loss.
    trained_test = json.loads((trained / files.METRICS).read_text())["test"]
    assert {k: v for k, v in one.items() if k != "loss"} == {k: v for k, v in trained_test.items() if k != "loss"}
    assert one["loss"] == pytest.approx(trained_test["loss"], rel=1e-5)


def test_a_missing_checkpoint_is_one_line_and_exit_1(tmp_path):
    result, seconds = launch(["-m", "training.evaluate", "--checkpoint_dir", str(tmp_path), "--preset", "smoke"])
    assert result.returncode == 1, describe(result)
    assert "config.json: missing" in result.stderr and "Traceback" not in result.stderr


def test_reports_per_class_confusion_matrix_and_misclassified_rows(trained, smoke_dir, evaluations):
    import csv

    from PIL import Image
    from sklearn.metrics import precision_recall_fscore_support

    one = evaluations[1]
    for n in (2, 3):  # the same rows, in the same order, whatever the number of processes
        assert evaluations[n][files.MISCLASSIFIED_CSV] == one[files.MISCLASSIFIED_CSV]
        assert evaluations[n]["per_class"] == one["per_class"]
    labels = one["confusion_matrix"]["labels"]
    confusion = one["confusion_matrix"]["rows_true_columns_predicted"]
    assert sum(map(sum, confusion)) == one["metrics"]["num_examples"]
    # per-class figures equal scikit-learn's on the same (true, predicted) pairs
    true = [i for i, row in enumerate(confusion) for j, count in enumerate(row) for _ in range(count)]
    predicted = [j for row in confusion for j, count in enumerate(row) for _ in range(count)]
    precision, recall, f1, support = precision_recall_fscore_support(
        true, predicted, labels=range(len(labels)), zero_division=0
    )
    for i, name in enumerate(labels):
        got = one["per_class"][name]
        assert (got["precision"], got["recall"], got["f1"], got["support"]) == pytest.approx(
            (precision[i], recall[i], f1[i], support[i]), abs=1e-12
        )

    with open(smoke_dir / "test.csv", encoding="utf-8") as fh:
        test_rows = list(csv.DictReader(fh))
    wrong = list(csv.DictReader(one[files.MISCLASSIFIED_CSV].decode().splitlines()))
    assert len(wrong) == one["metrics"]["num_examples"] - sum(confusion[i][i] for i in range(len(labels)))
    for row in wrong:  # each line is the test row it names, with its true label, and a wrong prediction
        source = test_rows[int(row["row"])]
        assert (row["text"], row["label"]) == (source["text"], labels[int(source["label"])]) and row[
            "predicted"
        ] != row["label"]
        assert float(row["predicted_probability"]) >= float(row["label_probability"])  # rounded to 4 decimals: ties
    confidence = [float(row["predicted_probability"]) for row in wrong]
    assert confidence == sorted(confidence, reverse=True)

    with Image.open(trained / files.CONFUSION_PNG) as image:
        assert image.format == "PNG" and image.width > 400
    table = one["stdout"]
    assert "precision    recall        f1   support" in table
    for name in labels:
        assert f"{one['per_class'][name]['f1']:.4f}" in table


def test_eval_results_name_the_weights_they_describe(trained, evaluations):
    described = evaluations[1]["model"]
    recorded = json.loads((trained / files.METRICS).read_text())
    assert described == {
        "weights_file": str(trained / files.WEIGHTS),
        "sha256": hashlib.sha256((trained / files.WEIGHTS).read_bytes()).hexdigest(),
        "best_step": recorded["best_step"],
        "global_step": recorded["global_step"],
    }


def test_weights_replaced_while_they_are_scored_write_no_results(smoke_model, tmp_path, monkeypatch, caplog):
    """A training run saving a new best model into the folder mid-evaluation: the results would describe neither
    model, so nothing is written and the error says why."""
    from training import evaluate

    out = Path(shutil.copytree(smoke_model, tmp_path / "out"))
    real_score = evaluate.score

    def score_then_training_saves(*args, **kwargs):
        scored = real_score(*args, **kwargs)
        weights = torch.load(out / files.WEIGHTS, weights_only=True)
        weights["classifier.bias"] += 1.0
        torch.save(weights, out / files.WEIGHTS)
        return scored

    monkeypatch.setattr(evaluate, "score", score_then_training_saves)
    assert evaluate.cli(["--checkpoint_dir", str(out), "--preset", "smoke"]) == 1
    [error] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert f"{out / files.WEIGHTS} changed while it was evaluated" in error and "results not written" in error
    assert not (out / files.EVAL_RESULTS).exists() and not (out / files.MISCLASSIFIED_CSV).exists()


@pytest.mark.slow
@pytest.mark.parametrize("module", ["training.evaluate", "training.predict"])
def test_a_bad_file_read_by_the_main_process_first_stops_every_rank_in_one_line(smoke_model, tmp_path, module):
    """A bad file stops every rank in seconds, said once."""
    bad = tmp_path / "bad.csv"
    bad.write_text("headline,label\nShares fell,2\nThe Yankees won,1\n")
    args = ["--checkpoint_dir", str(smoke_model)]
    if module == "training.evaluate":
        args += ["--test_file", str(bad)]
    else:
        args += ["--input_file", str(bad), "--output_file", str(tmp_path / "out.csv")]
    result, seconds = launch(["-m", module, *args], processes=2, timeout=240)
    assert result.returncode == 1, describe(result)
    [line] = [line for line in result.stderr.splitlines() if " ERROR " in line]  # said once, by the main process
    assert "missing column 'text' (found: headline, label)" in line, describe(result)
    assert "[rank0]: Traceback" not in result.stderr and "[rank1]: Traceback" not in result.stderr
    assert seconds < 120  # not the barrier's timeout (the launcher's own report of the exit follows the line)
