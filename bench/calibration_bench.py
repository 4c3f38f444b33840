"""Calibration by temperature (training/calibration.py) measured over seeds: the expected calibration error before and
after on validation (where the temperatures are fitted) and test (where they are not), and the test decisions
against the same run with `--calibration none` (they must match: single-label argmax, multi-label label sets at the
moved thresholds).

    python bench/calibration_bench.py                                   # smoke and smoke-multi-label, 3 seeds, ~3 min
    python bench/calibration_bench.py --presets smoke-multi-label --seeds 5
    python bench/calibration_bench.py --presets smoke-multi-label -- --train_file my.jsonl --test_file my_test.jsonl

Arguments after `--` go to every training run (your own multi-label data, another model). Not a CI test: it prints
figures to record in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
DECISION_METRICS = ("accuracy", "macro_f1", "micro_f1", "subset_accuracy")


def train(out: Path, preset: str, seed: int, calibration: str, extra: list[str]) -> dict:
    """metrics.json of one training run."""
    command = [sys.executable, str(ROOT / "training" / "train.py"), "--preset", preset, "--seed", str(seed)]
    command += ["--calibration", calibration, "--checkpointing_steps", "none", "--output_dir", str(out), *extra]
    result = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    return json.loads((out / "metrics.json").read_text())


def measure(preset: str, seed: int, extra: list[str], work: Path) -> dict:
    calibrated = train(work / f"{preset}-{seed}-t", preset, seed, "temperature", extra)
    plain = train(work / f"{preset}-{seed}-n", preset, seed, "none", extra)
    recorded = calibrated["calibration"]
    same = all(calibrated["test"][k] == plain["test"][k] for k in DECISION_METRICS if k in calibrated["test"])
    return {
        "temperatures": recorded.get("temperatures") or [recorded["temperature"]],
        "before": recorded["ece_before"],
        "after": recorded["ece_after"],
        "same_decisions": same,
        "test_loss": (plain["test"]["loss"], calibrated["test"]["loss"]),
    }


def report(preset: str, rows: list[dict]) -> None:
    print(f"\n{preset}: {len(rows)} seeds")
    print("| seed | T | ECE val before -> after | ECE test before -> after | test loss before -> after | decisions |")
    print("|---|---|---|---|---|---|")
    for seed, row in enumerate(rows):
        temperatures = ", ".join(f"{t:.3f}" for t in row["temperatures"])
        val = f"{row['before']['validation']:.4f} -> {row['after']['validation']:.4f}"
        test = f"{row['before']['test']:.4f} -> {row['after']['test']:.4f}"
        loss = f"{row['test_loss'][0]:.4f} -> {row['test_loss'][1]:.4f}"
        decisions = "same" if row["same_decisions"] else "DIFFER"
        print(f"| {seed} | {temperatures} | {val} | {test} | {loss} | {decisions} |")
    for split in ("validation", "test"):
        before = [r["before"][split] for r in rows]
        after = [r["after"][split] for r in rows]
        print(
            f"mean ECE {split}: {statistics.mean(before):.4f} -> {statistics.mean(after):.4f} "
            f"(lower after in {sum(a <= b for a, b in zip(after, before))} of {len(rows)})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="smoke,smoke-multi-label")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("extra", nargs="*", help="after --: passed to every training run")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; commit {commit.strip()}")
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets.split(","):
            rows = [measure(preset, seed, args.extra, Path(tmp)) for seed in range(args.seeds)]
            report(preset, rows)


if __name__ == "__main__":
    main()
