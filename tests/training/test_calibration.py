"""Calibrated scores carried in the weights (issue 41, point 4): a temperature fitted on validation and folded into the
output layer, so every consumer reads calibrated probabilities; the argmax unchanged."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
import torch
import transformers

from contract import files, problem_types
from contract.loading import load_model
from tests.helpers.processes import describe, run_train
from training import calibration

TEXTS = ["Shares fell after the bank cut its forecast.", "The striker scored twice.", "A new chip doubles battery life"]


def test_the_fitted_temperature_is_the_one_the_labels_were_drawn_with():
    """Labels drawn from softmax(z / 2.5): the temperature that fits them is 2.5 (within 10 %), and scoring with it
    lowers the expected calibration error of the over-confident softmax(z)."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(20_000, 4, generator=generator) * 4
    labels = torch.multinomial((logits / 2.5).softmax(-1), 1, generator=generator)[:, 0]
    (temperature,) = calibration.scale_for(problem_types.SINGLE).fit(logits.log_softmax(-1), labels)
    assert temperature == pytest.approx(2.5, rel=0.1)
    before = calibration.expected_calibration_error(logits.softmax(-1), labels)
    after = calibration.expected_calibration_error((logits / temperature).softmax(-1), labels)
    assert after < before / 3, (before, after)


def test_per_label_temperatures_are_the_ones_each_label_was_drawn_with():
    """Multi-label: each label's yes drawn from sigmoid(z_j / T_j), T = 0.5, 1, 2, 4: each fitted T_j is its own
    (within 10 %), and the error over every (text, label) yes/no falls."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(20_000, 4, generator=generator) * 3
    drawn = torch.tensor([0.5, 1.0, 2.0, 4.0])
    labels = torch.bernoulli((logits / drawn).sigmoid(), generator=generator)
    scale = calibration.scale_for(problem_types.MULTI)
    fitted = scale.fit(logits, labels)
    assert fitted == pytest.approx(drawn.tolist(), rel=0.1)
    before = scale.error(scale.probabilities(logits), labels)
    after = scale.error(scale.probabilities(logits, fitted), labels)
    assert after < before / 3, (before, after)


@pytest.mark.parametrize(
    ("name", "drawn", "kept"),
    [
        (problem_types.SINGLE, 2.5, True),
        (problem_types.SINGLE, 1.0, False),
        (problem_types.MULTI, 3.0, True),
        (problem_types.MULTI, 1.0, False),
    ],
)
def test_auto_keeps_a_temperature_only_where_it_helps_held_out_texts(name, drawn, kept):
    """Labels drawn at temperature `drawn` from 600 texts' logits: an over-confident model (drawn 2.5 or 3) gains on
    held-out halves and keeps its temperature; a calibrated one (drawn 1) gains nothing beyond noise and keeps none."""
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(600, 4, generator=generator) * 4
    if name == problem_types.SINGLE:
        labels = torch.multinomial((logits / drawn).softmax(-1), 1, generator=generator)[:, 0]
    else:
        labels = torch.bernoulli((logits / drawn).sigmoid(), generator=generator)
    measured = calibration.held_out(calibration.scale_for(name), logits, labels, seed=0)
    assert calibration.helps(measured) is kept, measured
    if kept:
        assert measured["nll_after"] < measured["nll_before"] and measured["ece_after"] < measured["ece_before"]


def test_helps_needs_a_margin_and_no_loss_on_the_other_measure():
    figures = {"nll_before": 1.0, "ece_before": 0.1}
    assert calibration.helps({**figures, "nll_after": 0.97, "ece_after": 0.1})
    assert not calibration.helps({**figures, "nll_after": 0.99, "ece_after": 0.099})  # within the margin
    assert not calibration.helps({**figures, "nll_after": 0.97, "ece_after": 0.11})  # the smoke model's case
    assert calibration.clamped([0.05, 1.3, 20.0]) == [0, 2]


def test_moved_thresholds_keep_every_multi_label_decision():
    """sigmoid(z / T) >= sigmoid(logit(t) / T) exactly when sigmoid(z) >= t, in float32 as the service computes."""
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(50_000, 4, generator=generator) * 3
    thresholds, temperatures = [0.2, 0.5, 0.7, 0.95], [0.3, 1.7, 0.8, 2.5]
    moved = calibration.moved_thresholds(thresholds, temperatures)
    assert moved[1] == 0.5 and moved[0] < 0.2 and moved[2] > 0.7 and moved[3] < 0.95
    before = logits.sigmoid() >= torch.tensor(thresholds)
    after = (logits / torch.tensor(temperatures)).sigmoid() >= torch.tensor(moved)
    assert torch.equal(before, after)
    assert calibration.moved_thresholds([0.0, 1.0], [0.5, 2.0]) == [0.0, 1.0]


def test_the_expected_calibration_error_is_the_weighted_gap_per_bin():
    probs = torch.tensor([[0.9, 0.1], [0.9, 0.1], [0.6, 0.4], [0.6, 0.4]])
    labels = torch.tensor([0, 1, 0, 0])  # bin of 0.9: accuracy 0.5; bin of 0.6: accuracy 1.0
    assert calibration.expected_calibration_error(probs, labels) == pytest.approx(0.5 * 0.4 + 0.5 * 0.4)
    assert calibration.reliability(probs, labels) == [(pytest.approx(0.6), 1.0, 2), (pytest.approx(0.9), 0.5, 2)]


def test_folding_divides_the_logits_by_the_temperature(smoke_dir):
    config = transformers.AutoConfig.from_pretrained(smoke_dir / "model", num_labels=4)
    torch.manual_seed(0)
    model = transformers.AutoModelForSequenceClassification.from_config(config).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(smoke_dir / "model")
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    layer = calibration.output_layer(model, 4)
    assert layer == "classifier"  # not pre_classifier
    with torch.no_grad():
        before = model(**batch).logits
        calibration.fold_temperature(model.state_dict(), layer, 1.7)  # the state dict's tensors are the model's
        after = model(**batch).logits
        calibration.fold_temperature(model.state_dict(), layer, [1.0, 2.0, 0.5, 4.0])  # each output row its own
        per_label = model(**batch).logits
    assert torch.allclose(after, before / 1.7, atol=1e-6) and torch.equal(after.argmax(-1), before.argmax(-1))
    assert torch.allclose(per_label, after / torch.tensor([1.0, 2.0, 0.5, 4.0]), atol=1e-6)


def test_a_regression_model_has_nothing_to_calibrate(smoke_dir, tmp_path):
    out = tmp_path / "out"
    result, _ = run_train(["--preset", "smoke-regression", "--calibration", "temperature", "--output_dir", str(out)])
    assert result.returncode == 2, describe(result)
    assert "calibration: a regression model has no probabilities to calibrate" in result.stderr
    assert not (out / files.WEIGHTS).exists()


@pytest.mark.slow
def test_the_smoke_model_is_calibrated_only_where_it_helps(smoke_model):
    """--calibration auto at the end of the run: the held-out measurement decides, config.json says what was applied,
    and the test ECE is never worse for it (before: T 1.198 took the smoke model's test ECE from 0.005 to 0.023)."""
    recorded = json.loads((smoke_model / files.METRICS).read_text())["calibration"]
    assert calibration.helps(recorded["held_out"]) == (recorded["method"] == "temperature"), recorded
    applied = json.loads((smoke_model / files.CONFIG).read_text())["calibration"]
    assert applied["method"] == recorded["method"]
    if recorded["method"] == "temperature":
        for split in ("validation", "test"):
            assert recorded["ece_after"][split] <= recorded["ece_before"][split], recorded
    else:
        assert len(recorded["fitted"]) == 1 and recorded["clamped"] == []


@pytest.mark.slow
def test_an_over_confident_model_is_calibrated_in_its_weights_and_every_consumer_reads_it(
    smoke_model, smoke_dir, tmp_path
):
    """An over-confident model on noisy labels: T near 5."""
    sharp = tmp_path / "sharp"
    shutil.copytree(smoke_model, sharp, ignore=shutil.ignore_patterns(files.STATE_DIR, files.RUNTIME_DIR))
    model = transformers.AutoModelForSequenceClassification.from_pretrained(sharp)
    calibration.fold_temperature(model.state_dict(), "classifier", 0.2)  # divided by 0.2: 5x
    model.save_pretrained(sharp)
    (sharp / files.WEIGHTS).unlink()  # the export is the model to start from
    for split, source in (("train", smoke_dir / "train.csv"), ("test", smoke_dir / "test.csv")):
        rows = pd.read_csv(source)
        noisy = rows.sample(frac=1 / 3, random_state=0).index
        rows.loc[noisy, "label"] = np.random.default_rng(0).integers(0, 4, len(noisy))
        rows.to_csv(tmp_path / f"noisy_{split}.csv", index=False)
    outs = {}
    for name in ("temperature", "none"):
        outs[name] = tmp_path / name
        args = ["--preset", "smoke", "--model_name_or_path", str(sharp), "--from_scratch", "false"]
        args += ["--train_file", str(tmp_path / "noisy_train.csv"), "--test_file", str(tmp_path / "noisy_test.csv")]
        args += ["--num_train_epochs", "1", "--learning_rate", "1e-9", "--calibration", name]
        args += ["--checkpointing_steps", "none", "--output_dir", str(outs[name])]
        result, _ = run_train(args)
        assert result.returncode == 0, describe(result)
    recorded = json.loads((outs["temperature"] / files.METRICS).read_text())["calibration"]
    temperature = recorded["temperature"]
    assert temperature > 3  # over-confident: softened
    for split in ("validation", "test"):
        assert recorded["ece_after"][split] <= recorded["ece_before"][split], recorded
    assert json.loads((outs["temperature"] / files.CONFIG).read_text())["calibration"] == {
        "method": "temperature",
        "temperature": temperature,
    }
    assert json.loads((outs["none"] / files.CONFIG).read_text())["calibration"] == {"method": "none"}
    assert json.loads((outs["none"] / files.METRICS).read_text())["calibration"] == {"method": "none"}
    served = {name: load_model(str(out), device="cpu", dtype="fp32") for name, out in outs.items()}
    batch = served["none"].tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = {name: loaded.model(**batch).logits for name, loaded in served.items()}
    assert torch.allclose(logits["temperature"], logits["none"] / temperature, atol=1e-5)
    assert torch.equal(logits["temperature"].argmax(-1), logits["none"].argmax(-1))
    classify = transformers.pipeline("text-classification", model=str(outs["temperature"]), top_k=None)
    for answers, row in zip(classify(TEXTS), logits["temperature"].softmax(-1)):
        expected = dict(zip(served["temperature"].labels, row.tolist()))
        assert {a["label"]: a["score"] for a in answers} == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("temperature", [float("nan"), -2.0, 0.0])
def test_a_resumed_run_refuses_a_recorded_temperature_it_would_divide_by(tmp_path, temperature):
    """A finished run resumed keeps the calibration its config.json records (training/finish.py calibrate): a NaN,
    negative or zero temperature there is one line, not a model divided by it."""
    from training.finish import saved_calibration
    from training.output.resume import ResumeError

    record = {"method": "temperature", "temperature": temperature}
    (tmp_path / files.CONFIG).write_text(json.dumps({"calibration": record}))
    with pytest.raises(ResumeError, match="calibration must be .* finite T > 0"):
        saved_calibration(tmp_path)
    (tmp_path / files.CONFIG).write_text(json.dumps({"calibration": {"method": "temperature", "temperature": 1.2}}))
    assert saved_calibration(tmp_path)["temperature"] == 1.2


def test_auto_fits_no_temperature_on_too_few_validation_texts_or_too_few_of_a_class():
    from training.calibration import FEWEST_PER_CLASS, FEWEST_TEXTS, Scale, too_few

    single, multi = Scale(per_label=False), Scale(per_label=True)
    logits = torch.zeros(FEWEST_TEXTS, 4)
    assert "60 validation texts, under 100" == too_few(single, logits[:60], torch.arange(60) % 4)
    assert too_few(single, logits, torch.arange(FEWEST_TEXTS) % 4) is None  # 25 a class
    rare = torch.tensor([3] * (FEWEST_PER_CLASS - 1) + [0, 1, 2] * 40)[:FEWEST_TEXTS]
    assert too_few(single, logits, rare) == f"a class with {FEWEST_PER_CLASS - 1} validation texts, under 10"
    absent = torch.arange(FEWEST_TEXTS) % 3  # the fourth class never in validation
    assert too_few(single, logits, absent) == "a class with 0 validation texts, under 10"
    hot = torch.zeros(FEWEST_TEXTS, 4)
    hot[:, :3] = 1
    hot[:5, 3] = 1
    assert too_few(multi, logits, hot) == "a label with 5 validation texts, under 10"
