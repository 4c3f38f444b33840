"""Score a saved checkpoint on a labelled split, on every process at once.

    python -m training.evaluate --checkpoint_dir checkpoints                      # ag_news test split (Hub)
    python -m training.evaluate --checkpoint_dir checkpoints --test_file news.csv
    python -m training.evaluate --checkpoint_dir checkpoints --preset smoke      # the smoke preset's test.csv
    accelerate launch --config_file accelerate_configs/cpu_2proc.yaml -m training.evaluate --checkpoint_dir ...

Each rank scores its shard; `gather_for_metrics` drops the duplicates accelerate adds to even out the last
batch, so the counts are exact with any number of processes. The main process prints a per-class table and
writes, beside the checkpoint, `eval_results.json` (metrics, per-class precision/recall/F1, confusion matrix),
`confusion_matrix.png` and `misclassified.csv` (training/reports.py). `evaluate()` is also what training calls.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import datasets
import torch
import transformers
from accelerate import Accelerator
from accelerate.logging import get_logger
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from inference import files
from training import checkpoint, reports
from training.config import TrainConfig
from training.data import DataError, eval_order, load_file, load_hub, make_eval_loader, tokenize, with_labels
from training.hub import HubUnavailableError, ensure_hub_or_offline
from training.metrics import classification_metrics, confusion_matrix, per_class
from training.smoke import ensure_smoke_assets, smoke_dir

logger = get_logger(__name__)


@dataclass
class Scored:
    """Per-example results in the split's row order, gathered from every rank (CPU tensors)."""

    labels: torch.Tensor
    probabilities: torch.Tensor
    losses: torch.Tensor


@torch.no_grad()
def score(accelerator: Accelerator, model, loader) -> Scored:
    """Every rank scores its shard; gather_for_metrics drops the padding duplicates of the last batch. The
    loader is not shuffled and accelerate hands out whole batches round-robin, so each gathered step is the
    next slice of the loader's dataset: results come back in the loader's order."""
    was_training = model.training
    model.eval()
    labels, probabilities, losses = [], [], []
    for batch in loader:
        logits = model(**batch).logits.float()
        loss = torch.nn.functional.cross_entropy(logits, batch["labels"], reduction="none")
        gathered = accelerator.gather_for_metrics((batch["labels"], logits.softmax(dim=-1), loss))
        for kept, value in zip((labels, probabilities, losses), gathered):
            kept.append(value)
    model.train(was_training)
    return Scored(torch.cat(labels).cpu(), torch.cat(probabilities).cpu(), torch.cat(losses).cpu())


def in_row_order(scored: Scored, order: list[int]) -> Scored:
    """Undo the loader's row order: scored row k is split row order[k]."""
    index = torch.tensor(order)

    def unsort(values: torch.Tensor) -> torch.Tensor:
        rows = torch.empty_like(values)
        rows[index] = values
        return rows

    return Scored(unsort(scored.labels), unsort(scored.probabilities), unsort(scored.losses))


def summarize(scored: Scored, num_labels: int) -> dict:
    """Accuracy, macro-F1, number of examples and mean loss."""
    metrics = classification_metrics(scored.probabilities.argmax(dim=1), scored.labels, num_labels)
    metrics["loss"] = scored.losses.mean().item()
    return metrics


def evaluate(accelerator: Accelerator, model, loader, num_labels: int) -> dict:
    """summarize() over the whole split, scored by every rank (every rank gets the same)."""
    return summarize(score(accelerator, model, loader), num_labels)


class CheckpointMissing(FileNotFoundError):
    """The checkpoint folder lacks a file training writes."""


def load_saved_model(checkpoint_dir: Path):
    """(model, tokenizer, label names, training config or {}) from what training/checkpoint.py wrote."""
    for name in (files.WEIGHTS, files.CONFIG, files.TOKENIZER_DIR):
        if not (checkpoint_dir / name).exists():
            raise CheckpointMissing(f"{checkpoint_dir / name}: missing; is {checkpoint_dir} a training output dir?")
    config = AutoConfig.from_pretrained(checkpoint_dir)
    model = AutoModelForSequenceClassification.from_config(config)
    model.load_state_dict(checkpoint.load_weights(checkpoint_dir / files.WEIGHTS))
    tokenizer = AutoTokenizer.from_pretrained(checkpoint_dir / files.TOKENIZER_DIR)
    metrics_file = checkpoint_dir / files.METRICS
    trained_with = json.loads(metrics_file.read_text()).get("config", {}) if metrics_file.is_file() else {}
    return model, tokenizer, [config.id2label[i] for i in range(config.num_labels)], trained_with


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m training.evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint_dir", default="checkpoints", help="a training output dir (default: checkpoints)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--test_file", help="csv/jsonl/parquet with text and label columns")
    source.add_argument("--dataset_name", help="a Hub dataset (default when no file is given: ag_news)")
    source.add_argument("--preset", choices=["smoke"], help="the smoke preset's test.csv (offline)")
    parser.add_argument("--split", default="test", help="Hub split (default: test)")
    parser.add_argument("--text_column", default="text")
    parser.add_argument("--label_column", default="label")
    parser.add_argument("--max_length", type=int, help="default: the training run's max_length, else 128")
    parser.add_argument("--per_device_eval_batch_size", type=int, default=64)
    parser.add_argument("--mixed_precision", choices=["no", "bf16", "fp16"], default="no")
    return parser.parse_args(argv)


def load_split(args: argparse.Namespace, cfg: TrainConfig, label_names: list[str]) -> tuple[datasets.Dataset, str]:
    if args.preset == "smoke":
        ensure_smoke_assets()
        args.test_file = str(smoke_dir() / "test.csv")
    if args.test_file:
        return with_labels(load_file(args.test_file), args.test_file, cfg, label_names), args.test_file
    name = args.dataset_name or "ag_news"
    ensure_hub_or_offline(needs_hub=True)
    hub = load_hub(name)
    if args.split not in hub:
        raise DataError(f"dataset {name!r}: no {args.split!r} split (found: {', '.join(hub)})")
    return with_labels(hub[args.split], f"{name}[{args.split}]", cfg, label_names), f"{name}[{args.split}]"


def run(args: argparse.Namespace, accelerator: Accelerator) -> dict:
    root = Path(args.checkpoint_dir)
    model, tokenizer, label_names, trained_with = load_saved_model(root)
    cfg = TrainConfig(text_column=args.text_column, label_column=args.label_column,
                      max_length=args.max_length or trained_with.get("max_length", 128))
    with accelerator.main_process_first():  # the main process tokenizes and caches; the others read it
        split, source = load_split(args, cfg, label_names)
        texts = split[cfg.text_column]  # for misclassified.csv: tokenizing drops the column
        split = tokenize(split, tokenizer, cfg, "evaluation")
    loader = make_eval_loader(split, tokenizer, args.per_device_eval_batch_size)
    model, loader = accelerator.prepare(model, loader)
    scored = in_row_order(score(accelerator, model, loader), eval_order(split))
    if not torch.equal(scored.labels, torch.tensor(split["labels"])):  # misclassified.csv depends on it
        raise RuntimeError("gathered results are not in the split's row order")
    metrics = summarize(scored, len(label_names))
    confusion = confusion_matrix(scored.probabilities.argmax(dim=1), scored.labels, len(label_names))
    classes = per_class(confusion, label_names)
    results = {"checkpoint_dir": str(root), "data": source, "world_size": accelerator.num_processes,
               "max_length": cfg.max_length, "metrics": metrics, "per_class": classes,
               "confusion_matrix": {"labels": label_names, "rows_true_columns_predicted": confusion.tolist()},
               "files": [files.EVAL_RESULTS, files.CONFUSION_PNG, files.MISCLASSIFIED_CSV]}
    logger.info("%s on %s (%d processes):\n%s", root, source, accelerator.num_processes,
                reports.report_table(classes, metrics), main_process_only=True)
    if accelerator.is_main_process:
        checkpoint.write_json(root / files.EVAL_RESULTS, results)
        reports.write_confusion_matrix(root / files.CONFUSION_PNG, confusion, label_names,
                                       f"{source}: accuracy {metrics['accuracy']:.4f}")
        wrong = reports.write_misclassified(root / files.MISCLASSIFIED_CSV, texts,
                                            scored.labels, scored.probabilities, label_names)
        logger.info("Wrote %s, %s, %s (%d misclassified) in %s", files.EVAL_RESULTS, files.CONFUSION_PNG,
                    files.MISCLASSIFIED_CSV, wrong, root)
    return results


def cli(argv: list[str] | None = None) -> int:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S",
                        level=logging.INFO)
    args = parse_args(argv)
    accelerator = Accelerator(cpu=not torch.cuda.is_available(), mixed_precision=args.mixed_precision)
    if not accelerator.is_local_main_process:
        datasets.utils.logging.set_verbosity_error()
        transformers.utils.logging.set_verbosity_error()
    try:
        run(args, accelerator)
    except (CheckpointMissing, DataError, HubUnavailableError) as exc:
        logger.error("%s", exc)
        return 1
    finally:
        accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(cli())
