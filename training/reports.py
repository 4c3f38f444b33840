"""What people look at after a run or an evaluation: the per-class table, the confusion-matrix and training
curve PNGs and the misclassified examples (the model card is training/model_card.py).

Every function takes finished numbers; the callers decide that only the main process writes. Plots use
matplotlib's object API with the Agg canvas (no pyplot, no global backend switch, no display needed).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from inference import files
from training.atomic import write_bytes, write_json

if TYPE_CHECKING:
    from training.checkpoint import Progress


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
        lines.append(
            f"{name:<{width}} {row['precision']:>9.4f} {row['recall']:>9.4f} {row['f1']:>9.4f} {row['support']:>9d}"
        )
    n = metrics["num_examples"]
    mean = {k: sum(row[k] for row in per_class.values()) / len(per_class) for k in ("precision", "recall")}
    lines.append(f"{'accuracy':<{width}} {'':>9} {'':>9} {metrics['accuracy']:>9.4f} {n:>9d}")
    lines.append(
        f"{'macro avg':<{width}} {mean['precision']:>9.4f} {mean['recall']:>9.4f} {metrics['macro_f1']:>9.4f} {n:>9d}"
    )
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
            ax.text(
                j,
                i,
                f"{int(counts[i, j])}\n{shares[i, j]:.1%}",
                ha="center",
                va="center",
                fontsize=9,
                color="white" if shares[i, j] > 0.5 else "black",
            )
    ax.set_xticks(range(n), label_names, rotation=30, ha="right")
    ax.set_yticks(range(n), label_names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title)
    write_bytes(path, _png(figure))


def write_misclassified(
    path: Path, texts: Sequence[str], labels: torch.Tensor, probabilities: torch.Tensor, label_names: Sequence[str]
) -> int:
    """Every wrong prediction, most confident first: row of the split, text, label, prediction, probabilities."""
    predictions = probabilities.argmax(dim=1)
    wrong = (predictions != labels).nonzero().flatten().tolist()
    wrong.sort(key=lambda i: (-probabilities[i, predictions[i]].item(), i))
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["row", "text", "label", "predicted", "predicted_probability", "label_probability"])
    for i in wrong:
        writer.writerow(
            [
                i,
                texts[i],
                label_names[labels[i]],
                label_names[predictions[i]],
                f"{probabilities[i, predictions[i]].item():.4f}",
                f"{probabilities[i, labels[i]].item():.4f}",
            ]
        )
    write_bytes(path, buffer.getvalue().encode("utf-8"))
    return len(wrong)


# --------------------------------------------------------------------------------------------- training


def write_training_curves(output_dir: Path, progress: Progress, plot: bool = True) -> None:
    """training_curves.json (the raw series) and, with `plot`, training_curves.png: loss per logging step,
    validation metrics per evaluation, learning rate. (Drawing the PNG costs the main process a second or two
    while the other ranks wait, so the loop writes it once, at the end.)"""
    series = {"train": progress.train_loss, "validation": progress.history}
    write_json(output_dir / files.CURVES_JSON, series)
    if plot:
        write_bytes(output_dir / files.CURVES_PNG, _png(_curves_figure(progress)))


def _curves_figure(progress: Progress):
    from matplotlib.figure import Figure

    figure = Figure(figsize=(13, 3.6))
    loss_ax, eval_ax, lr_ax = figure.subplots(1, 3)
    steps = [row["step"] for row in progress.train_loss]
    loss_ax.plot(steps, [row["loss"] for row in progress.train_loss], marker=".", label="train (logged mean)")
    loss_ax.plot(
        [row["step"] for row in progress.history],
        [row["loss"] for row in progress.history],
        marker="o",
        label="validation",
    )
    loss_ax.set(title="loss", xlabel="optimizer step")
    for metric in ("accuracy", "macro_f1"):
        eval_ax.plot(
            [row["step"] for row in progress.history],
            [row[metric] for row in progress.history],
            marker="o",
            label=metric,
        )
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
    return figure
