"""How much sooner does `agnews tune --ray` finish a search than trials one after another? The same study (the
learning rate searched, 1 epoch a trial) runs both ways in one run, alternately; the ratio is of wall seconds from
start to tune.json. Each Ray trial starts a fresh worker (imports, data, model), so short trials lose.

    python bench/tune_ray_bench.py                      # the smoke preset: about 3 minutes on 2 CPU cores
    python bench/tune_ray_bench.py --real --rounds 1    # MiniLM-L6 on 1,200 real AG News rows a trial

Not a CI test: it prints one markdown block for docs/benchmarks.md (the machine, the commit, the ratio).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPACE = "learning_rate: {type: float, low: 1.0e-4, high: 3.0e-3, log: true}\n"


AG_NEWS = ROOT.parent / "shared" / "data" / "ag_news" / "train_subset.csv"


def run_flags(real: bool, work: Path) -> list[str]:
    """The smoke preset, or MiniLM-L6 on real AG News rows (1,200 to train and validate, 200 to test)."""
    if not real:
        return ["--preset", "smoke"]
    import pandas as pd

    rows = pd.read_csv(AG_NEWS).sample(1400, random_state=0)
    rows[:1200].to_csv(work / "train.csv", index=False)
    rows[1200:].to_csv(work / "test.csv", index=False)
    return ["--model_name_or_path", "minilm", "--train_file", str(work / "train.csv"), "--test_file",
            str(work / "test.csv")]  # fmt: skip


def timed(flags: list[str], n_trials: int, folder: Path) -> tuple[float, list[str]]:
    """Wall seconds of one search, and its trials' states."""
    (folder / "space.yaml").write_text(SPACE)
    command = [sys.executable, "-m", "training.commands", "tune", "--num_train_epochs", "1"]
    command += ["--n_trials", str(n_trials), "--search_space", str(folder / "space.yaml")]
    started = time.perf_counter()
    done = subprocess.run([*command, *flags, "--output_dir", str(folder / "out")], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
    seconds = time.perf_counter() - started
    if done.returncode:
        sys.exit(f"{' '.join(command + flags)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    trials = json.loads((folder / "out" / "tune.json").read_text())["trials"]
    return seconds, [t["state"] for t in trials]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n_trials", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--real", action="store_true", help="MiniLM-L6 on real AG News rows, not the smoke preset")
    args = parser.parse_args()
    ways = {"one after another": [], f"--ray, {os.cpu_count()} at a time": ["--ray"]}
    seconds: dict[str, list[float]] = {way: [] for way in ways}
    data = Path(tempfile.mkdtemp())
    for _ in range(args.rounds):
        for way, flags in ways.items():
            with tempfile.TemporaryDirectory() as work:
                took, states = timed([*run_flags(args.real, data), *flags], args.n_trials, Path(work))
            seconds[way].append(took)
            print(f"  {way:24} {took:6.1f} s  trials: {', '.join(states)}", file=sys.stderr)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    print(f"\nmachine: {platform.machine()} CPU, {os.cpu_count()} cores; commit {commit.stdout.strip()}")
    what = "MiniLM-L6, 1,200 real AG News rows" if args.real else "smoke preset"
    print(f"search: {what}, {args.n_trials} trials of 1 epoch, learning rate searched; best of {args.rounds}\n")
    print("| how | wall s | one after another / this |\n|---|---|---|")
    serial = min(seconds["one after another"])
    for way, took in seconds.items():
        print(f"| {way} | {min(took):.1f} | {serial / min(took):.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
