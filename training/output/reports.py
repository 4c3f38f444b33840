"""What people read after a run or an evaluation: per-class tables, PNGs and error tables. Called by finish.py and
evaluate.
"""

from __future__ import annotations

import csv
import io
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from contract import files, scoring
from contract.problem_types import PROBLEM_TYPES, ProblemType
from training import calibration
from training.output.atomic import write_bytes, write_json
from training.scoring.metrics import Scored

if TYPE_CHECKING:
    from training.output.progress import Progress


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return buffer.getvalue()


# ------------------------------------------------------------------------------------------- evaluation


@dataclass
class Evaluated:
    """What python -m training.evaluate's reports are drawn from."""

    texts: Sequence[str]
    scored: Scored
    problem: ProblemType
    labels: list[str]
    evaluation: dict  # eval_results.json
    title: str


def written_for(problem_type: str) -> list[str]:
    """The files evaluate writes for this problem type."""
    return [REPORTS[name][0] for name in PROBLEM_TYPES[problem_type].reports]


def write_reports(root: Path, evaluated: Evaluated) -> int:
    """The problem type's reports into `root`."""
    rows = 0
    for name in evaluated.problem.reports:
        file, draw = REPORTS[name]
        rows += draw(root / file, evaluated) or 0
    return rows


def report_table(per_class: dict[str, dict[str, float]], metrics: dict[str, Any]) -> str:
    """The terminal summary table."""
    if not per_class:
        shown = ("mse", "mae", "r2", "pearson", "spearman", "ndcg_at_10", "mrr_at_10", "map", "loss")  # no classes
        return "\n".join(f"{k:<12} {metrics[k]:>9.4f}" for k in shown if k in metrics)
    multi = "micro_f1" in metrics
    width = max(16 if multi else 12, *(len(name) for name in per_class))
    lines = [f"{'label' if multi else 'class':<{width}} {'precision':>9} {'recall':>9} {'f1':>9} {'support':>9}"]
    for name, row in per_class.items():
        lines.append(
            f"{name:<{width}} {row['precision']:>9.4f} {row['recall']:>9.4f} {row['f1']:>9.4f} {row['support']:>9d}"
        )
    n = metrics["num_examples"]
    if multi:
        lines += [f"{key.replace('_', ' '):<{width}} {metrics[key]:>29.4f}" for key in ("micro_f1", "macro_f1")]
        lines.append(f"{'subset accuracy':<{width}} {metrics['subset_accuracy']:>29.4f} {n:>9d}")
    else:
        mean = {k: sum(row[k] for row in per_class.values()) / len(per_class) for k in ("precision", "recall")}
        lines.append(f"{'accuracy':<{width}} {'':>9} {'':>9} {metrics['accuracy']:>9.4f} {n:>9d}")
        lines.append(
            f"{'macro avg':<{width}} {mean['precision']:>9.4f} {mean['recall']:>9.4f} {metrics['macro_f1']:>9.4f} "
            f"{n:>9d}"
        )
    lines.append(f"{'loss':<{width}} {metrics['loss']:>9.4f}")
    return "\n".join(lines)


def write_confusion_matrix(path: Path, confusion: torch.Tensor, label_names: Sequence[str], title: str) -> None:
    """Counts, coloured by row share."""
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


def write_reliability_diagram(
    path: Path, points: Sequence[tuple[float, float, int]], ece: float, title: str, per_label: bool = False
) -> None:
    """The reliability diagram, ECE in the title; `per_label`: every label's yes/no score is a point."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(5.5, 5.2))
    ax = figure.add_subplot()
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="calibrated")
    # each bar over its bin, a dot at its mean, its count above
    bins = calibration.BINS
    centres = [(min(int(c * bins), bins - 1) + 0.5) / bins for c, _, _ in points]
    ax.bar(centres, [a for _, a, _ in points], width=0.9 / bins, alpha=0.7, label="accuracy per confidence bin")
    ax.plot([c for c, _, _ in points], [a for _, a, _ in points], "k.", markersize=4, label="mean confidence")
    for centre, (_, a, n) in zip(centres, points, strict=True):
        ax.annotate(str(n), (centre, a), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=7)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("confidence (each label's yes or no score)" if per_label else "confidence (top score)")
    ax.set_ylabel("share of those decisions that were right" if per_label else "accuracy")
    ax.set_title(f"{title}\nexpected calibration error {ece:.4f}", fontsize=9)
    ax.legend(loc="upper left", fontsize=8)
    write_bytes(path, _png(figure))


def write_misclassified(
    path: Path,
    texts: Sequence[str],
    labels: torch.Tensor,
    scores: torch.Tensor,
    problem: ProblemType,
    label_names: Sequence[str],
) -> int:
    """Every wrong prediction, most confident first; `decision`: the label, or `review` inside the review band."""
    predictions, withheld = problem.decisions(scores), problem.decided(scores).withheld()
    wrong = (predictions != labels).nonzero().flatten().tolist()
    wrong.sort(key=lambda i: (-scores[i, predictions[i]].item(), i))
    rows = [
        [
            i,
            texts[i],
            label_names[labels[i]],
            label_names[predictions[i]],
            scoring.REVIEW if withheld[i] else label_names[predictions[i]],
            f"{scores[i, predictions[i]].item():.4f}",
            f"{scores[i, labels[i]].item():.4f}",
        ]
        for i in wrong
    ]
    header = ["row", "text", "label", "predicted", "decision", "predicted_probability", "label_probability"]
    _write_csv(path, header, rows)
    return len(wrong)


def write_wrong_label_sets(
    path: Path, texts: Sequence[str], scored: Scored, problem: ProblemType, label_names: Sequence[str]
) -> int:
    """Wrong label sets, most wrong first; `decision` and `review`: the labels decided yes and withheld by the review
    band."""
    actual, predicted, decided = scored.labels.bool(), problem.decisions(scored.scores), problem.decided(scored.scores)
    misses = (predicted != actual).sum(dim=1)
    wrong = sorted(misses.nonzero().flatten().tolist(), key=lambda i: (-int(misses[i]), i))

    def names(row) -> str:
        return "|".join(label_names[j] for j, yes in enumerate(row.tolist()) if yes)

    rows = [
        [
            i,
            texts[i],
            names(actual[i]),
            names(predicted[i]),
            names(decided.chosen[i]),
            names(decided.review[i]),
            " ".join(f"{v:.4f}" for v in scored.scores[i].tolist()),
        ]
        for i in wrong
    ]
    _write_csv(path, ["row", "text", "labels", "predicted_labels", "decision", "review", "scores"], rows)
    return len(wrong)


def write_review_band(path: Path, points: Sequence[tuple[float, float]], evaluation: dict, title: str) -> None:
    """The review band's trade-off: the precision of the decisions kept against their share, the target and where
    the fitted band stands."""
    from matplotlib.figure import Figure

    band = evaluation["review_band"]
    figure = Figure(figsize=(5.5, 4.4))
    ax = figure.add_subplot()
    ax.plot([c for c, _ in points], [p for _, p in points], label="yes decisions kept from the highest score down")
    target = band["target_precision"]
    ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target}")
    if band["precision"] is not None:
        ax.plot([band["coverage"]], [band["precision"]], "ko", label="the fitted band, on this split")
    ax.set_xlim(0, 1.02)
    ax.set_xlabel("coverage (share of decisions kept)")
    ax.set_ylabel("precision of the decisions kept")
    ax.set_title(f"{title}\nreview band: coverage {band['coverage']:.3f}", fontsize=9)
    ax.legend(loc="lower left", fontsize=8)
    write_bytes(path, _png(figure))


def write_residuals(path: Path, predicted: torch.Tensor, targets: torch.Tensor, title: str) -> None:
    """Predicted against true, and residuals."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10, 4.2))
    left, right = figure.subplots(1, 2)
    low, high = min(predicted.min(), targets.min()).item(), max(predicted.max(), targets.max()).item()
    left.scatter(targets.numpy(), predicted.numpy(), s=6, alpha=0.5)
    left.plot([low, high], [low, high], color="grey", linewidth=1)
    left.set_xlabel("true value")
    left.set_ylabel("predicted value")
    right.scatter(predicted.numpy(), (predicted - targets).numpy(), s=6, alpha=0.5)
    right.axhline(0, color="grey", linewidth=1)
    right.set_xlabel("predicted value")
    right.set_ylabel("residual (predicted - true)")
    figure.suptitle(title)
    write_bytes(path, _png(figure))


def write_largest_errors(path: Path, texts: Sequence[str], predicted: torch.Tensor, targets: torch.Tensor) -> int:
    """Regression: every row, largest absolute error first."""
    errors = (predicted - targets).abs()
    order = sorted(range(len(errors)), key=lambda i: (-errors[i].item(), i))
    rows = [
        [i, texts[i], f"{targets[i].item():.4f}", f"{predicted[i].item():.4f}", f"{errors[i].item():.4f}"]
        for i in order
    ]
    _write_csv(path, ["row", "text", "target", "predicted", "absolute_error"], rows)
    return len(rows)


def _write_csv(path: Path, header: list[str], rows: list[list]) -> None:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    writer.writerows(rows)
    write_bytes(path, buffer.getvalue().encode("utf-8"))


# --------------------------------------------------------------------------------------------- training


def _confusion_matrix(path: Path, e: Evaluated) -> None:
    confusion = torch.tensor(e.evaluation["confusion_matrix"]["rows_true_columns_predicted"])
    write_confusion_matrix(path, confusion, e.labels, e.title)


def _calibration(path: Path, e: Evaluated) -> None:
    scale = calibration.scale_for(e.problem.name)
    points = scale.points(e.scored.scores, e.scored.labels)
    write_reliability_diagram(path, points, e.evaluation["calibration"]["ece"], e.title, scale.per_label)


def _misclassified(path: Path, e: Evaluated) -> int:
    return write_misclassified(path, e.texts, e.scored.labels, e.scored.scores, e.problem, e.labels)


def _wrong_label_sets(path: Path, e: Evaluated) -> int:
    return write_wrong_label_sets(path, e.texts, e.scored, e.problem, e.labels)


def _residuals(path: Path, e: Evaluated) -> None:
    write_residuals(path, e.scored.scores[:, 0], e.scored.labels, e.title)


def _largest_errors(path: Path, e: Evaluated) -> int:
    return write_largest_errors(path, e.texts, e.scored.scores[:, 0], e.scored.labels)


REPORTS: dict[str, tuple[str, Callable[[Path, Evaluated], int | None]]] = {  # name: (file, how it is drawn)
    "confusion_matrix": (files.CONFUSION_PNG, _confusion_matrix),
    "calibration": (files.RELIABILITY_PNG, _calibration),
    "misclassified": (files.MISCLASSIFIED_CSV, _misclassified),
    "wrong_label_sets": (files.MISCLASSIFIED_CSV, _wrong_label_sets),
    "residuals": (files.RESIDUALS_PNG, _residuals),
    "largest_errors": (files.LARGEST_ERRORS_CSV, _largest_errors),
}


def write_training_curves(output_dir: Path, progress: Progress, plot: bool = True) -> None:
    """training_curves.json and, with `plot`, its PNG (drawn once at the end: it costs seconds)."""
    series = {"train": progress.train_loss, "validation": progress.history}
    write_json(output_dir / files.CURVES_JSON, series)
    if plot:
        write_bytes(output_dir / files.CURVES_PNG, _png(_curves_figure(progress)))


def headline(results: dict) -> tuple[str, ...]:
    """The headline metrics a results dict holds."""
    types = sorted(PROBLEM_TYPES.values(), key=lambda problem: -len(problem.headline))
    return next((problem.headline for problem in types if set(problem.headline) <= results.keys()), ())


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
    for metric in [m for m in headline(progress.history[0]) if m in progress.history[0]] if progress.history else []:
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


def folder_size(root: Path, kept_states: bool) -> str:
    """A finished run's folder size, for its last line: ' (91 MB, its resumable states removed: --keep_states)'."""
    size = sum(p.lstat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())
    states = "with" if kept_states else "its resumable states removed:"
    return f" ({size / 1e6:.1f} MB, {states} --keep_states)"


def next_steps(cfg, best_step: int, best_metric: float, test_metrics: dict | None, size: str = "") -> str:
    """A run's last line: where the model is (and its folder's size), how good, what to run next."""
    folder, metric = shlex.quote(str(cfg.output_dir)), cfg.metric_for_best_model
    tested = (test_metrics or {}).get(metric)
    test = f", test {tested:.4f}" if isinstance(tested, float) else ""
    data = f" --test_file {shlex.quote(str(cfg.test_file))}" if cfg.test_file else ""
    held = "  (on the rows it held out for validation)" if cfg.train_file and not cfg.test_file else ""
    own = next((path for path in (cfg.test_file, cfg.validation_file, cfg.train_file) if path), None)
    label = (  # a file of this run's own to label; a Hub run has none to name
        f"  |  label a file: agnews predict --checkpoint_dir {folder} --input_file {shlex.quote(str(own))} "
        f"--output_file {shlex.quote(str(Path(cfg.output_dir) / 'labelled.csv'))}"
        if own
        else ""
    )
    return (
        f"Done: the best model (step {best_step}, validation {metric} {best_metric:.4f}{test}) is in {folder}{size}. "
        f"Evaluate it: agnews evaluate --checkpoint_dir {folder}{data}{held}{label}  |  serve it: "
        f"agnews serve --model_id {folder}"
    )
