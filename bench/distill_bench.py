"""Distillation on real text: a MiniLM-L6 teacher fine-tuned on 4,000 labelled AG News rows, a 3-layer copy of it
distilled (`agnews distill --student_layers 3`) on the other rows' texts without their labels, against the same
3-layer copy trained on the 4,000 labels alone (and distilled with them mixed in); accuracy on held-out rows, and
each model's serving examples/s.

    python bench/distill_bench.py            # about 11 minutes on 2 CPU cores

The shared rows number 13,426: 10 % held out for accuracy, 4,000 labelled for the teacher, and the rest (about
8,000, where the issue names 20,000) unlabelled for the student. Serving: the service (BACKEND torch, fp32, one
process) answering 32-text /predict requests in turn for each model, the best of 3 rounds, the order alternated.
Not a CI test: it prints one markdown block for docs/benchmarks-log.md (the machine, the commit, the rows).
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

from train_bench import AG_NEWS, LABELS, minilm_package  # noqa: E402

LABELLED = 4000
COMMON = ["--max_length", "128", "--num_train_epochs", "2", "--per_device_train_batch_size", "32",
          "--checkpointing_steps", "none", "--mixed_precision", "bf16", "--label_names", ",".join(LABELS)]  # fmt: skip


def split(work: Path, seed: int) -> dict[str, int]:
    """heldout.csv and labelled.csv (text, class id), unlabelled.csv (text) from the shared rows."""
    with open(AG_NEWS, encoding="utf-8") as fh:
        rows = [(r["text"], int(r["label"])) for r in csv.DictReader(fh)]
    random.Random(seed).shuffle(rows)
    held = len(rows) // 10
    parts = {"heldout": rows[:held], "labelled": rows[held : held + LABELLED], "unlabelled": rows[held + LABELLED :]}
    for name, part in parts.items():
        with open(work / f"{name}.csv", "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(["text"] if name == "unlabelled" else ["text", "label"])
            writer.writerows([(text,) for text, _ in part] if name == "unlabelled" else part)
    return {name: len(part) for name, part in parts.items()}


def run(module: str, *args: str) -> float:
    started = time.perf_counter()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"{module} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return time.perf_counter() - started


def held_out_accuracy(folder: Path, work: Path) -> float:
    run("training.evaluate", "--checkpoint_dir", str(folder), "--test_file", str(work / "heldout.csv"))
    return json.loads((folder / "eval_results.json").read_text())["metrics"]["accuracy"]


def serving_speed(folders: dict[str, Path], texts: list[str], rounds: int = 3) -> dict[str, float]:
    """Examples/s of each model's service answering 32-text /predict requests, best of `rounds`."""
    from fastapi.testclient import TestClient

    from inference.app import create_app
    from inference.settings import Settings

    best = dict.fromkeys(folders, 0.0)
    batches = [[[t] for t in texts[i : i + 32]] for i in range(0, len(texts), 32)]
    order = list(folders)
    with contextlib.ExitStack() as stack:
        clients = {
            name: stack.enter_context(
                TestClient(create_app(Settings(model_id=str(f), dtype="fp32", backend="torch", reload_interval_s=0)))
            )
            for name, f in folders.items()
        }
        for _ in range(rounds):
            for name in order:
                started = time.perf_counter()
                for batch in batches:
                    assert clients[name].post("/predict", json={"inputs": batch}).status_code == 200
                best[name] = max(best[name], len(texts) / (time.perf_counter() - started))
            order.reverse()
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    with tempfile.TemporaryDirectory(prefix="distill_bench_") as tmp:
        work = Path(tmp)
        sizes = split(work, args.seed)
        minilm = str(minilm_package())
        teacher, student, alone = work / "teacher", work / "student", work / "alone"
        seconds = {"teacher": run("training.train", "--model_name_or_path", minilm, "--train_file",
                                  str(work / "labelled.csv"), "--learning_rate", "1e-4", *COMMON, "--output_dir",
                                  str(teacher))}  # fmt: skip
        seconds["student"] = run("training.distill", "--teacher", str(teacher), "--input_file",
                                 str(work / "unlabelled.csv"), "--student_layers", "3", "--learning_rate", "2e-4",
                                 *COMMON, "--output_dir", str(student))  # fmt: skip
        mixed = work / "mixed"  # the unlabelled texts and the labelled rows, half of the loss on real labels
        seconds["mixed"] = run("training.distill", "--teacher", str(teacher), "--input_file",
                               str(work / "unlabelled.csv"), "--train_file", str(work / "labelled.csv"),
                               "--distill_alpha", "0.5", "--student_layers", "3", "--learning_rate", "2e-4", *COMMON,
                               "--output_dir", str(mixed))  # fmt: skip
        from training.distill.students import smaller_copy

        smaller_copy(teacher, "3", work / "copy")  # the same 3 layers, trained on the labels alone
        seconds["alone"] = run("training.train", "--model_name_or_path", str(work / "copy"), "--tokenizer_name",
                               str(work / "copy" / "tokenizer"), "--train_file", str(work / "labelled.csv"),
                               "--learning_rate", "2e-4", *COMMON, "--output_dir", str(alone))  # fmt: skip
        accuracy = {name: held_out_accuracy(folder, work) for name, folder in
                    (("teacher", teacher), ("student", student), ("mixed", mixed), ("alone", alone))}  # fmt: skip
        agreement = json.loads((student / "metrics.json").read_text())["agreement_with_teacher"]
        with open(work / "heldout.csv", encoding="utf-8") as fh:
            texts = [row["text"] for row in csv.DictReader(fh)][:512]
        speed = serving_speed({"teacher": teacher, "student": student}, texts)
    print(f"### Distillation on real text, MiniLM-L6 teacher (commit {commit.stdout.strip()})\n")
    print(f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, python "
          f"{platform.python_version()}; rows: {sizes} (seed {args.seed}); 2 epochs, batch 32, max_length 128, bf16; "
          f"teacher lr 1e-4, students 2e-4\n")  # fmt: skip
    print("| model | held-out accuracy | serving examples/s | training wall s |")
    print("|---|---|---|---|")
    print(f"| teacher: MiniLM-L6 on {LABELLED} labels | {accuracy['teacher']:.4f} | {speed['teacher']:.0f} | "
          f"{seconds['teacher']:.0f} |")  # fmt: skip
    print(f"| student: its 3-layer copy distilled on {sizes['unlabelled']} unlabelled texts | "
          f"{accuracy['student']:.4f} | {speed['student']:.0f} | {seconds['student']:.0f} |")  # fmt: skip
    print(f"| the same, with the {LABELLED} labelled rows mixed in (--distill_alpha 0.5) | "
          f"{accuracy['mixed']:.4f} | - | {seconds['mixed']:.0f} |")  # fmt: skip
    print(f"| the 3-layer copy on the {LABELLED} labels alone | {accuracy['alone']:.4f} | - | {seconds['alone']:.0f} |")
    print(f"\nStudent against teacher: {100 * (accuracy['student'] - accuracy['teacher']):+.2f} points, "
          f"{speed['student'] / speed['teacher']:.2f}x its serving examples/s (goal: within 1 point at >= 1.8x); "
          f"agreement on {agreement['texts']} held-out texts {100 * agreement['agreement']:.2f} %.")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
