"""Does `agnews tune` train a trial as fast as `agnews train` trains the same settings? Each round runs
`agnews train --preset smoke` and `agnews tune --preset smoke --n_trials 1` (its one trial is the settings as given),
alternately, on an idle machine and beside one busy process, and compares what each run's metrics.json says: the
training loop's seconds and the whole run's (data, model, evaluations, test and calibration included).

    python bench/tune_speed.py              # about 2 minutes on 2 CPU cores
    python bench/tune_speed.py --rounds 5

Not a CI test: it prints one markdown block for docs/benchmarks.md (the machine, the commit, the ratios).
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
BUSY = "while True: pass"


def timed(command: list[str], folder: Path) -> tuple[float, float]:
    """(training loop s, whole run s) of one command's run, from the metrics.json it leaves in `folder`."""
    done = subprocess.run([sys.executable, "-m", "training.commands", *command], cwd=ROOT, capture_output=True,
                          text=True)  # fmt: skip
    if done.returncode:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    metrics = json.loads((folder / "metrics.json").read_text())
    return metrics["throughput"]["train_seconds"], metrics["train_runtime_s"]


def measure(rounds: int, work: Path) -> dict[str, list[tuple[float, float]]]:
    runs: dict[str, list[tuple[float, float]]] = {"train": [], "tune": []}
    for i in range(rounds):
        train_dir, tune_dir = work / f"train_{i}", work / f"tune_{i}"
        runs["train"].append(timed(["train", "--preset", "smoke", "--output_dir", str(train_dir)], train_dir))
        search = ["tune", "--preset", "smoke", "--n_trials", "1", "--output_dir", str(tune_dir)]
        runs["tune"].append(timed(search, tune_dir / "trials" / "trial_0"))
    return runs


def rows(label: str, runs: dict[str, list[tuple[float, float]]]) -> list[str]:
    out = []
    for what, index in (("training loop", 0), ("whole trial", 1)):
        train = statistics.median(r[index] for r in runs["train"])
        tune = statistics.median(r[index] for r in runs["tune"])
        out.append(f"| {label} | {what} | {train:.2f} s | {tune:.2f} s | **{tune / train:.2f}x** |")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    table = ["| machine | time | agnews train | agnews tune's trial | tune / train |", "|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory(prefix="tune_speed_") as tmp:
        table += rows("idle", measure(args.rounds, Path(tmp) / "idle"))
        busy = subprocess.Popen([sys.executable, "-c", BUSY])
        try:
            table += rows("one core busy", measure(args.rounds, Path(tmp) / "busy"))
        finally:
            busy.kill()
    print(f"### tune's trial against train, smoke preset ({commit.stdout.strip()})\n")
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores; median of {args.rounds} rounds\n")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
