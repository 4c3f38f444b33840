"""Multi-label training when some labels are rare: which default serves them. The smoke generator's topic stories
(training/smoke.py), each topic in a chosen share of the texts (default: Sports 50 %, Business 40 %, World 4 %,
Sci/Tech 2 %), trained with the smoke-multi-label preset four ways over seeds: the defaults, `--class_weights
balanced` (each label's pos_weight its negatives over its positives), `--threshold_strategy per_label`, and both.
Per run: micro- and macro-F1 on the test texts, the rare labels' F1 and recall, and whether the best model predicts
some label for every text or for none (metrics.json `one_sided_labels`).

    python bench/rare_labels.py                       # 3 seeds, ~6 minutes on 2 cores
    python bench/rare_labels.py --shares 0.5,0.4,0.04,0.02 --seeds 5

Not a CI test: it prints figures to record in docs/benchmarks-log.md ("Rare labels in multi-label training").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from training.smoke import LABELS, NUM_TEST, NUM_TRAIN, _sentence  # noqa: E402

# twin runs compared text for text: one thread count for all, not each run's choice by the machine's load
ENV = {"OMP_NUM_THREADS": str(os.cpu_count()), **os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
WAYS = {
    "defaults": [],
    "class_weights balanced": ["--class_weights", "balanced"],
    "per_label thresholds": ["--threshold_strategy", "per_label"],
    "both": ["--class_weights", "balanced", "--threshold_strategy", "per_label"],
}


def stories(num: int, shares: list[float], seed: int) -> list[dict]:
    """Stories whose topics each appear in about their share of the texts (at least one topic per story)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(num):
        topics = [label for label, share in zip(LABELS, shares) if rng.random() < share]
        topics = topics or [rng.choices(LABELS, weights=shares)[0]]
        sentences = [_sentence(rng, topic) for topic in topics]
        rng.shuffle(sentences)
        rows.append({"text": " ".join(sentences), "labels": sorted(topics)})
    return rows


def write(folder: Path, shares: list[float]) -> tuple[Path, Path]:
    paths = []
    for split, (num, seed) in {"train": (NUM_TRAIN, 31), "test": (NUM_TEST, 32)}.items():
        path = folder / f"rare_{split}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in stories(num, shares, seed)))
        paths.append(path)
    return paths[0], paths[1]


def train(out: Path, data: tuple[Path, Path], seed: int, flags: list[str]) -> dict:
    command = [sys.executable, str(ROOT / "training" / "train.py"), "--preset", "smoke-multi-label"]
    command += ["--train_file", str(data[0]), "--test_file", str(data[1]), "--seed", str(seed)]
    command += ["--checkpointing_steps", "none", "--output_dir", str(out), *flags]
    result = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    return json.loads((out / "metrics.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shares", default="0.04,0.5,0.4,0.02", help=f"each label's share, in order {LABELS}")
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    shares = [float(s) for s in args.shares.split(",")]
    rare = [label for label, share in zip(LABELS, shares) if share < 0.1]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs; commit {commit.strip()}")
    print(f"shares: {dict(zip(LABELS, shares))}; {args.seeds} seeds; means over the seeds")
    print(f"| way | micro-F1 | macro-F1 | F1 of {', '.join(rare)} | their recall | runs with a one-sided label |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        data = write(Path(tmp), shares)
        for way, flags in WAYS.items():
            runs = [train(Path(tmp) / f"{way}-{seed}", data, seed, flags) for seed in range(args.seeds)]
            print(row(way, runs, rare))


def row(way: str, runs: list[dict], rare: list[str]) -> str:
    tests = [run["test"] for run in runs]

    def mean(key: str) -> float:
        return statistics.mean(t[key] for t in tests)

    f1 = " / ".join(f"{mean(f'f1_{label}'):.3f}" for label in rare)
    recall = " / ".join(f"{mean(f'recall_{label}'):.3f}" for label in rare)
    one_sided = sum(bool(run["one_sided_labels"]) for run in runs)
    return f"| {way} | {mean('micro_f1'):.3f} | {mean('macro_f1'):.3f} | {f1} | {recall} | {one_sided} of {len(runs)} |"


if __name__ == "__main__":
    main()
