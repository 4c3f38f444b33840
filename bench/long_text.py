"""Long documents: what --long_text chunk gains in accuracy, costs in throughput, and what --gradient_checkpointing
saves in memory. Offline, on the CPU; prints markdown rows for docs/benchmarks.md.

    python bench/long_text.py                 # about 5 minutes on 2 CPU cores
    python bench/long_text.py --skip_memory   # accuracy and throughput only

1. Accuracy: the smoke-long preset (stories whose label sentence sits past the first 48-token window) trained and
   tested with truncation, with chunking (mean pooling) and with chunking (max pooling): test accuracy of each.
2. Throughput: a DistilBERT-base-shaped model (random weights, the smoke tokenizer) scoring long stories (~600 tokens)
   through training.predict's scoring path: truncated to 128 tokens vs every 128-token window (stride 32), texts/s and
   windows/s, and the ratio of the two in one run.
3. Memory: the same base-shaped model trained for a few steps at max_length 512 (batch 8) without and with
   --gradient_checkpointing: peak memory (CPU: the process's peak RSS) and examples/s, from each run's metrics.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from transformers import AutoTokenizer, DistilBertConfig, DistilBertForSequenceClassification  # noqa: E402

from contract import files  # noqa: E402
from contract.loading import load_model  # noqa: E402
from contract.long_text import CHUNK, LongText  # noqa: E402
from training.batch.rows import score_chunk  # noqa: E402
from training.smoke import LABELS, ensure_smoke_assets, make_long_documents  # noqa: E402


def train(args: list[str], out: Path) -> dict:
    command = [sys.executable, str(ROOT / "training" / "train.py"), *args, "--checkpointing_steps", "none"]
    subprocess.run([*command, "--output_dir", str(out)], check=True, capture_output=True, cwd=ROOT)
    return json.loads((out / files.METRICS).read_text())


def accuracy(folder: Path) -> None:
    print("| smoke-long (label sentence past the first 48-token window) | test accuracy | windows scored |")
    print("|---|---|---|")
    for name, extra in {
        "truncate": ["--long_text", "truncate"],
        "chunk, mean pooling": [],
        "chunk, max pooling": ["--chunk_pooling", "max"],
    }.items():
        test = train(["--preset", "smoke-long", *extra], folder / "out")["test"]
        print(f"| {name} | {test['accuracy']:.4f} | {test.get('num_windows', test['num_examples'])} |")


def base_shaped(folder: Path, smoke: Path) -> Path:
    """DistilBERT-base's shape (6 layers, 768 wide), random weights, the smoke tokenizer: a servable folder."""
    tokenizer = AutoTokenizer.from_pretrained(smoke / "model")
    config = DistilBertConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, num_labels=len(LABELS))
    torch.manual_seed(0)
    DistilBertForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def long_stories(n: int, per_story: int = 6) -> list[str]:
    """Stories of about 600 tokens: `per_story` long smoke stories each."""
    parts = [text for text, _ in make_long_documents(n * per_story, seed=21)]
    return [" ".join(parts[i : i + per_story]) for i in range(0, len(parts), per_story)]


def throughput(model: Path, texts: list[str]) -> None:
    loaded = load_model(str(model), device="cpu", dtype="fp32")
    torch.set_num_threads(torch.get_num_threads())
    print("| base-shaped model, ~600-token stories | texts/s | windows/s | windows per text |")
    print("|---|---|---|---|")
    rates = {}
    for name, long_text in {"truncate to 128": LongText(), "chunk 128, stride 32": LongText(CHUNK, 32)}.items():
        score_chunk(loaded, texts[:4], None, 16, 128, long_text)  # warm-up
        started = time.perf_counter()
        _, windows = score_chunk(loaded, texts, None, 16, 128, long_text)
        seconds = time.perf_counter() - started
        rates[name] = len(texts) / seconds
        print(f"| {name} | {rates[name]:.1f} | {sum(windows) / seconds:.1f} | {sum(windows) / len(texts):.2f} |")
    truncate, chunk = rates.values()
    print(f"\nchunk / truncate texts/s: {chunk / truncate:.3f}")


def memory(model: Path, folder: Path, texts: list[str]) -> None:
    train_file = folder / "long_train.csv"
    with open(train_file, "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([("text", "label"), *((text, i % len(LABELS)) for i, text in enumerate(texts))])
    common = ["--model_name_or_path", str(model), "--train_file", str(train_file), "--max_length", "512"]
    common += ["--per_device_train_batch_size", "8", "--max_train_steps", "6", "--mixed_precision", "fp32"]
    common += ["--validation_split", "0.2", "--per_device_eval_batch_size", "8", "--export_hf_format", "false"]
    print("| base-shaped model, max_length 512, batch 8, 6 steps | peak memory (MB) | examples/s |")
    print("|---|---|---|")
    for flag in ("false", "true"):
        speed = train([*common, "--gradient_checkpointing", flag], folder / f"gc_{flag}")["throughput"]
        name = "--gradient_checkpointing" if flag == "true" else "activations kept"
        print(f"| {name} | {speed['peak_memory_mb_per_process']:.0f} | {speed['examples_per_second']:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip_memory", action="store_true")
    parser.add_argument("--texts", type=int, default=64, help="stories scored for the throughput rows")
    args = parser.parse_args()
    smoke = ensure_smoke_assets()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        accuracy(folder)
        print()
        model = base_shaped(folder / "base", smoke)
        texts = long_stories(args.texts)
        throughput(model, texts)
        if not args.skip_memory:
            print()
            memory(model, folder, long_stories(80))


if __name__ == "__main__":
    main()
