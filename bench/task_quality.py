"""Does each problem type learn? Every task the smoke generator writes, trained and scored offline on the CPU.

    python bench/task_quality.py             # about 2 minutes on 2 CPU cores

Not a CI test: it prints figures to record in docs/benchmarks.md. Each row is one `training/train.py` run (one
process, the smoke tiny DistilBERT, 3 epochs unless said) and the test metrics its metrics.json records:
single-label (the 4-class preset), multi-label with fixed and with per-label thresholds, regression on one text and
on sentence pairs, and a 1:20 binary set (Sports against the rest) after 80 steps without and with balanced class
weights: the minority class's recall is what the weights change.
"""

from __future__ import annotations

import csv
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from contract import files  # noqa: E402
from training.smoke import ensure_smoke_assets, make_split  # noqa: E402

PAIRS = ["--text_column_names", "sentence1", "--text_pair_column", "sentence2", "--label_column", "pair_score"]
SHOWN = ("accuracy", "macro_f1", "recall_sports", "micro_f1", "subset_accuracy", "mse", "r2", "pearson", "spearman")


def imbalanced(folder: Path) -> list[str]:
    """Sports stories kept at 15 % of their share: about 1 in 21 of the rows."""
    rng = random.Random(0)
    paths = []
    for split, n, seed in (("train", 9000, 11), ("test", 2000, 12)):
        rows = [(t, "sports" if y == 1 else "other") for t, y in make_split(n, seed) if y != 1 or rng.random() < 0.15]
        path = folder / f"imbalanced_{split}.csv"
        with open(path, "w", newline="", encoding="utf-8") as fh:
            csv.writer(fh).writerows([("text", "label"), *rows])
        paths.append(str(path))
    return ["--train_file", paths[0], "--test_file", paths[1], "--label_names", "other,sports"]


def runs(folder: Path) -> dict[str, list[str]]:
    skewed = [*imbalanced(folder), "--max_train_steps", "80", "--metric_for_best_model", "recall_sports"]
    return {
        "single-label (4 classes)": ["--preset", "smoke"],
        "multi-label, thresholds 0.5": ["--preset", "smoke-multi-label"],
        "multi-label, per-label thresholds": ["--preset", "smoke-multi-label", "--threshold_strategy", "per_label"],
        "regression, one text": ["--preset", "smoke-regression"],
        "regression, sentence pairs": ["--preset", "smoke-regression", *PAIRS],
        "1:20, no class weights (80 steps)": ["--preset", "smoke", *skewed, "--class_weights", "none"],
        "1:20, balanced class weights (80 steps)": ["--preset", "smoke", *skewed, "--class_weights", "balanced"],
    }


def main() -> None:
    ensure_smoke_assets()
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in runs(Path(tmp)).items():
            out = Path(tmp) / "out"
            command = [sys.executable, str(ROOT / "training" / "train.py"), *args, "--checkpointing_steps", "none"]
            subprocess.run([*command, "--output_dir", str(out)], check=True, capture_output=True, cwd=ROOT)
            test = json.loads((out / files.METRICS).read_text())["test"]
            figures = "  ".join(f"{k} {test[k]:.4f}" for k in SHOWN if k in test)
            print(f"| {name} | {figures} |")
            subprocess.run(["rm", "-rf", str(out)], check=True)


if __name__ == "__main__":
    main()
