"""The intra-op threads a CPU training run chooses (cpu_speed.choose_threads) against torch's default (all
physical cores), on an idle machine and beside a process that keeps one core busy: the smoke preset's training time
(metrics.json `train_runtime_s`, data and model loading left out) and the ratio default / chosen, each the median of
`--repeats` runs.

    python bench/cpu_threads.py                    # ~2 minutes on 2 cores
    python bench/cpu_threads.py --preset smoke-long --repeats 5

Not a CI test: it prints figures to record in docs/benchmarks-log.md ("CPU threads").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def train_seconds(preset: str, threads: int | None) -> float:
    """Training time of one run: with OMP_NUM_THREADS=`threads`, or unset (the command chooses)."""
    env = {k: v for k, v in ENV.items() if k != "OMP_NUM_THREADS"}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, str(ROOT / "training" / "train.py"), "--preset", preset, "--output_dir", out]
        result = subprocess.run([*command, "--checkpointing_steps", "none"], cwd=ROOT, env=env, capture_output=True)
        if result.returncode != 0:
            sys.exit(f"{' '.join(command)} failed:\n{result.stderr.decode()[-3000:]}")
        return json.loads((Path(out) / "metrics.json").read_text())["train_runtime_s"]


@contextlib.contextmanager
def busy_core(on: bool):
    """A process spinning on one core while the block runs (when `on`)."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if on else None
    try:
        yield
    finally:
        if spinner:
            spinner.kill()
            spinner.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="smoke")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    default = torch.get_num_threads()
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}")
    print(f"| machine | torch default ({default} threads) | chosen (OMP_NUM_THREADS unset) | default / chosen |")
    print("|---|---|---|---|")
    for busy in (False, True):
        with busy_core(busy):
            times = {
                name: statistics.median(train_seconds(args.preset, threads) for _ in range(args.repeats))
                for name, threads in (("default", default), ("chosen", None))
            }
        label, ratio = "one core kept busy" if busy else "idle", times["default"] / times["chosen"]
        print(f"| {label} | {times['default']:.1f} s | {times['chosen']:.1f} s | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
