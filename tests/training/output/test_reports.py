"""training/output/reports.py: the files people read, from known numbers."""

from __future__ import annotations

import csv
import json
from dataclasses import replace

import torch
from PIL import Image

from contract import files
from contract.problem_types import SINGLE, ProblemType
from training.output import model_card, reports
from training.output.progress import Progress

LABELS = ["World", "Sports", "Business", "Sci/Tech"]


def test_misclassified_rows_most_confident_first_with_the_review_bands_decision(tmp_path):
    probabilities = torch.tensor([[0.9, 0.1, 0, 0], [0.2, 0.7, 0.1, 0], [0.1, 0.1, 0.8, 0], [0.6, 0.4, 0, 0]])
    labels = torch.tensor([0, 0, 2, 1])  # rows 1 and 3 are wrong
    problem = replace(ProblemType.named(SINGLE, 4), band=((0.0, 0.65),))  # top scores under 0.65 are withheld
    count = reports.write_misclassified(
        tmp_path / "m.csv", ["a", "b, with a comma", "c", "d\nnewline"], labels, probabilities, problem, LABELS
    )
    rows = list(csv.DictReader(open(tmp_path / "m.csv", newline="", encoding="utf-8")))
    assert count == 2 and [r["row"] for r in rows] == ["1", "3"]  # 0.7 before 0.6
    assert rows[0] == {
        "row": "1",
        "text": "b, with a comma",
        "label": "World",
        "predicted": "Sports",
        "decision": "Sports",
        "predicted_probability": "0.7000",
        "label_probability": "0.2000",
    }
    assert rows[1]["text"] == "d\nnewline" and rows[1]["predicted"] == "World" and rows[1]["decision"] == "review"
    one = (["a"], torch.tensor([0]), probabilities[:1], problem, LABELS)
    assert reports.write_misclassified(tmp_path / "none.csv", *one) == 0
    assert (tmp_path / "none.csv").read_text().startswith("row,text,label")


def test_curves_are_written_even_before_the_first_logged_loss(tmp_path):
    progress = Progress(
        history=[{"step": 5, "epoch": 0, "accuracy": 0.5, "macro_f1": 0.4, "loss": 1.2, "num_examples": 10}],
        best_step=5,
    )
    reports.write_training_curves(tmp_path, progress)  # train_loss is empty: fewer steps than logging_steps
    assert json.loads((tmp_path / files.CURVES_JSON).read_text()) == {"train": [], "validation": progress.history}
    with Image.open(tmp_path / files.CURVES_PNG) as image:
        assert image.format == "PNG"


def test_report_table():
    per_class = {name: {"precision": 1.0, "recall": 0.5, "f1": 2 / 3, "support": 2} for name in LABELS}
    metrics = {"accuracy": 0.5, "macro_f1": 2 / 3, "num_examples": 8, "loss": 0.25}
    table = reports.report_table(per_class, metrics).splitlines()
    assert table[1].split() == ["World", "1.0000", "0.5000", "0.6667", "2"]
    assert table[-3].split() == ["accuracy", "0.5000", "8"] and table[-2].split()[:2] == ["macro", "avg"]


def test_model_card_body():
    config = {
        "model_name_or_path": "distilbert-base-uncased",
        "dataset_name": "ag_news",
        "train_file": None,
        "output_dir": "runs/x",
        "learning_rate": 5e-5,
        "num_train_epochs": 2,
        "per_device_train_batch_size": 32,
        "gradient_accumulation_steps": 2,
        "max_length": 128,
        "warmup_ratio": 0.1,
        "weight_decay": 0.01,
        "seed": 42,
    }
    metrics = {"accuracy": 0.5, "macro_f1": 2 / 3, "num_examples": 8, "loss": 0.25}
    run = {
        "config": config,
        "label_names": LABELS,
        "validation": metrics,
        "test": None,
        "global_step": 100,
        "world_size": 8,
        "effective_batch_size": 512,
        "mixed_precision": "bf16",
        "best_step": 100,
        "metric_for_best_model": "accuracy",
        "num_examples": {"train": 114000, "validation": 6000, "test": 7600},
    }
    card = str(model_card.model_card(run))
    assert card.startswith("---\nbase_model: distilbert-base-uncased\n")
    assert "- ag_news" in card and "fine-tuned from `distilbert-base-uncased`" in card
    assert "| effective batch | 512 |" in card and "| validation (best) | 0.5000 |" in card
    assert "| test |" not in card  # no test split, no test row
    assert 'pipeline("text-classification", model="runs/x")' in card
    without_export = str(model_card.model_card({**run, "config": {**config, "export_hf_format": False}}))
    assert "pipeline(" not in without_export and "model.safetensors" not in without_export
