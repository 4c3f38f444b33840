"""What people look at after a run or an evaluation: the per-class table, the confusion-matrix and training
curve PNGs, the misclassified examples, and the model card (README.md) of the output dir.

Every function takes finished numbers; the callers decide that only the main process writes. Plots use
matplotlib's object API with the Agg canvas (no pyplot, no global backend switch, no display needed).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any, Sequence

import torch

from inference import files
from training import checkpoint



def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return buffer.getvalue()


# ------------------------------------------------------------------------------------------- evaluation


def report_table(per_class: dict[str, dict[str, float]], metrics: dict[str, Any]) -> str:
    """The terminal summary: one row per class, then accuracy and the macro average."""
    width = max(12, *(len(name) for name in per_class))
    lines = [f"{'class':<{width}} {'precision':>9} {'recall':>9} {'f1':>9} {'support':>9}"]
    for name, row in per_class.items():
        lines.append(f"{name:<{width}} {row['precision']:>9.4f} {row['recall']:>9.4f} {row['f1']:>9.4f} "
                     f"{row['support']:>9d}")
    n = metrics["num_examples"]
    mean = {k: sum(row[k] for row in per_class.values()) / len(per_class) for k in ("precision", "recall")}
    lines.append(f"{'accuracy':<{width}} {'':>9} {'':>9} {metrics['accuracy']:>9.4f} {n:>9d}")
    lines.append(f"{'macro avg':<{width}} {mean['precision']:>9.4f} {mean['recall']:>9.4f} "
                 f"{metrics['macro_f1']:>9.4f} {n:>9d}")
    lines.append(f"{'loss':<{width}} {metrics['loss']:>9.4f}")
    return "\n".join(lines)


def write_confusion_matrix(path: Path, confusion: torch.Tensor, label_names: Sequence[str], title: str) -> None:
    """Counts in each cell, colour by the share of the true class (rows sum to 1)."""
    from matplotlib.figure import Figure

    counts = confusion.double()
    shares = counts / counts.sum(1, keepdim=True).clamp(min=1)
    n = len(label_names)
    figure = Figure(figsize=(1.4 * n + 2.5, 1.2 * n + 1.8))
    ax = figure.add_subplot()
    image = ax.imshow(shares.numpy(), cmap="Blues", vmin=0, vmax=1)
    figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="share of the true class")
    for i in range(n):
        for j in range(n):
            ax.text(j, i, f"{int(counts[i, j])}\n{shares[i, j]:.1%}", ha="center", va="center", fontsize=9,
                    color="white" if shares[i, j] > 0.5 else "black")
    ax.set_xticks(range(n), label_names, rotation=30, ha="right")
    ax.set_yticks(range(n), label_names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title)
    checkpoint.write_bytes(path, _png(figure))


def write_misclassified(path: Path, texts: Sequence[str], labels: torch.Tensor, probabilities: torch.Tensor,
                        label_names: Sequence[str]) -> int:
    """Every wrong prediction, most confident first: row of the split, text, label, prediction, probabilities."""
    predictions = probabilities.argmax(dim=1)
    wrong = (predictions != labels).nonzero().flatten().tolist()
    wrong.sort(key=lambda i: (-probabilities[i, predictions[i]].item(), i))
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["row", "text", "label", "predicted", "predicted_probability", "label_probability"])
    for i in wrong:
        writer.writerow([i, texts[i], label_names[labels[i]], label_names[predictions[i]],
                         f"{probabilities[i, predictions[i]].item():.4f}", f"{probabilities[i, labels[i]].item():.4f}"])
    checkpoint.write_bytes(path, buffer.getvalue().encode("utf-8"))
    return len(wrong)


# --------------------------------------------------------------------------------------------- training


def write_training_curves(output_dir: Path, progress: checkpoint.Progress) -> None:
    """training_curves.json (the raw series) and training_curves.png: loss per logging step, validation
    metrics per evaluation, learning rate."""
    from matplotlib.figure import Figure

    series = {"train": progress.train_loss, "validation": progress.history}
    checkpoint.write_json(output_dir / files.CURVES_JSON, series)
    figure = Figure(figsize=(13, 3.6))
    loss_ax, eval_ax, lr_ax = figure.subplots(1, 3)
    steps = [row["step"] for row in progress.train_loss]
    loss_ax.plot(steps, [row["loss"] for row in progress.train_loss], marker=".", label="train (logged mean)")
    loss_ax.plot([row["step"] for row in progress.history], [row["loss"] for row in progress.history], marker="o",
                 label="validation")
    loss_ax.set(title="loss", xlabel="optimizer step")
    for metric in ("accuracy", "macro_f1"):
        eval_ax.plot([row["step"] for row in progress.history], [row[metric] for row in progress.history],
                     marker="o", label=metric)
    if progress.best_step is not None:
        eval_ax.axvline(progress.best_step, color="grey", linestyle=":", label=f"best (step {progress.best_step})")
    eval_ax.set(title="validation", xlabel="optimizer step")
    lr_ax.plot(steps, [row["lr"] for row in progress.train_loss], marker=".")
    lr_ax.set(title="learning rate", xlabel="optimizer step")
    lr_ax.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    for ax in (loss_ax, eval_ax):
        ax.legend(fontsize=8)
    for ax in (loss_ax, eval_ax, lr_ax):
        ax.grid(alpha=0.3)
    figure.tight_layout()
    checkpoint.write_bytes(output_dir / files.CURVES_PNG, _png(figure))


def model_card(summary: dict[str, Any]) -> str:
    """README.md of the output dir, from the run summary (metrics.json)."""
    cfg = summary["config"]
    folder = cfg["output_dir"]
    labels = summary.get("label_names") or []
    if cfg.get("train_file"):
        data = ", ".join([f"`{cfg['train_file']}`"] + [f"{split} `{cfg[f'{split}_file']}`"
                                                       for split in ("validation", "test") if cfg.get(f"{split}_file")])
    else:
        data = f"Hub dataset `{cfg['dataset_name']}`"
    counts = summary.get("num_examples", {})
    front = {"library_name": "transformers", "pipeline_tag": "text-classification",
             "base_model": cfg["model_name_or_path"], "tags": ["text-classification", "distilbert-agnews"]}
    if not cfg.get("train_file"):
        front["datasets"] = [cfg["dataset_name"]]

    def metric_rows(name: str, metrics: dict | None) -> list[str]:
        if not metrics:
            return []
        return [f"| {name} | {metrics['accuracy']:.4f} | {metrics['macro_f1']:.4f} | {metrics['loss']:.4f} | "
                f"{metrics['num_examples']} |"]

    hyper = [("learning rate", cfg["learning_rate"]), ("epochs", cfg["num_train_epochs"]),
             ("optimizer steps", summary["global_step"]),
             ("per-device batch", cfg["per_device_train_batch_size"]),
             ("gradient accumulation", cfg["gradient_accumulation_steps"]), ("world size", summary["world_size"]),
             ("effective batch", summary["effective_batch_size"]), ("max_length", cfg["max_length"]),
             ("warmup ratio", cfg["warmup_ratio"]), ("weight decay", cfg["weight_decay"]),
             ("mixed precision", summary["mixed_precision"]), ("seed", cfg["seed"]),
             ("best model", f"step {summary['best_step']} by validation {summary['metric_for_best_model']}")]
    lines = ["---"] + [f"{key}: {json.dumps(value)}" for key, value in front.items()] + ["---", ""]
    lines += [
        f"# Text classifier {'trained from scratch on the architecture of' if cfg.get('from_scratch') else 'fine-tuned from'}"
        f" `{cfg['model_name_or_path']}`", "",
        f"Trained with distilbert-agnews (`training/train.py`) on {data}"
        + (f": {counts.get('train', '?')} training, {counts.get('validation', '?')} validation and "
           f"{counts.get('test', 0)} test examples." if counts else "."), "",
        "## Labels", "", "| id | label |", "|---|---|", *[f"| {i} | {name} |" for i, name in enumerate(labels)], "",
        "## Results", "", "| split | accuracy | macro-F1 | loss | examples |", "|---|---|---|---|---|",
        *metric_rows("validation (best)", summary.get("validation")), *metric_rows("test", summary.get("test")), "",
        f"Curves: `{files.CURVES_PNG}` (raw series in `{files.CURVES_JSON}`); every number in `{files.METRICS}`.", "",
        "## Training", "", "| setting | value |", "|---|---|", *[f"| {k} | {v} |" for k, v in hyper], "",
        "## Use it", "",
        "Serve it (`POST /predict`):", "", "```bash", f"python -m inference --model_id {folder} --port 8000",
        "curl -s localhost:8000/predict -H 'content-type: application/json' -d '{\"inputs\": \"Stocks rallied\"}'",
        "```", "",
    ]
    listed = f"`{files.WEIGHTS}` (state_dict, what the service loads), `config.json`, `{files.TOKENIZER_DIR}/`"
    if cfg.get("export_hf_format", True):
        lines += [
            "or load it with transformers (the folder is also in Hugging Face format: `model.safetensors`, "
            "`config.json`, tokenizer files):", "", "```python", "from transformers import pipeline", "",
            f'classify = pipeline("text-classification", model="{folder}")',
            'classify("Stocks rallied as oil prices fell")', "```", "",
        ]
        listed += f", `{files.HF_WEIGHTS}` and the tokenizer files (Hugging Face format)"
    lines += [f"Files: {listed}, `{files.METRICS}`.", ""]
    return "\n".join(lines)


def write_model_card(output_dir: Path, summary: dict[str, Any]) -> None:
    checkpoint.write_bytes(output_dir / files.MODEL_CARD, model_card(summary).encode("utf-8"))
