"""Where a training step's time goes: train.py under torch.profiler for a few steps after warm-up.

    python bench/profile_step.py --out /tmp/prof -- <train.py arguments>

Prints the host and device time per step and the top operators; writes a Chrome trace to --out.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/profile_step"))
    parser.add_argument("--skip", type=int, default=60, help="steps before profiling (compilation, warm-up)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("train_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    from training import loop, train

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    prof = profile(activities=activities, schedule=schedule(wait=args.skip, warmup=2, active=args.steps))
    forward, stamps = loop.forward_loss, []

    def profiled_step(run, batch):  # a step's boundary: each batch's forward pass begins one
        prof.step()
        stamps.append(time.perf_counter())
        return forward(run, batch)

    loop.forward_loss = profiled_step
    prof.start()
    code = train.cli([a for a in args.train_args if a != "--"])
    prof.stop()
    sort = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=25))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
    gaps = [b - a for a, b in zip(stamps[args.skip :], stamps[args.skip + 1 :])]
    if gaps:
        print(f"wall per step after {args.skip}: median {1000 * sorted(gaps)[len(gaps) // 2]:.2f} ms over {len(gaps)}")
    args.out.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(args.out / "trace.json"))
    return code


if __name__ == "__main__":
    sys.exit(main())
