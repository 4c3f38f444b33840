"""`agnews evaluate`: score a saved checkpoint on a labelled split, on every process at once.

Writes eval_results.json and the problem type's reports beside the model, naming the weights scored.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import datasets
import torch
from accelerate import Accelerator
from accelerate.logging import get_logger

from contract import agreement, files, precision
from contract.errors import CheckpointError
from contract.files import file_sha256
from contract.hub import ensure_hub_or_offline
from contract.loading import LoadedModel, load_model
from contract.problem_types import GRADES
from training import arguments, calibration
from training.cli import run_command, setup_logging
from training.collective import decided_on_main, main_first
from training.config import TrainConfig
from training.data.batching import make_eval_loader
from training.data.errors import DataError
from training.data.labels import LabelSpace
from training.data.reading import LABEL_FLAG, hub_split, labelled, load_file, load_hub, load_splits, require_columns
from training.data.tokenizing import tokenize
from training.output import reports
from training.output.atomic import write_json
from training.scoring import review
from training.scoring.metrics import MetricSuite, Scored
from training.scoring.split import score
from training.smoke import ensure_smoke_assets, presets

logger = get_logger(__name__)
# ------------------------------------------------------------------------------- python -m training.evaluate


@dataclass
class SavedModel:
    """A model folder read for scoring, and how its run read data."""

    loaded: LoadedModel
    trained_with: dict  # the training run's config, {} for a folder from elsewhere
    label_values: list | None  # the run's label value of each id

    def data_config(self, args: argparse.Namespace) -> TrainConfig:
        """Columns: the flags', the run's, else defaults."""
        fields = (
            "text_column_names",
            "text_column_delimiter",
            "text_pair_column",
            "label_column",
            "label_delimiter",
            "max_length",
        )
        values = {name: self.trained_with[name] for name in fields if name in self.trained_with}
        values.update({name: getattr(args, name) for name in fields if getattr(args, name, None) is not None})
        return TrainConfig(**values)

    def labels_for(self, ds: datasets.Dataset, column: str) -> LabelSpace:
        """The run's label values, else class ids or names."""
        names, problem_type = self.loaded.labels, self.loaded.problem.name
        values = self.label_values
        if self.loaded.problem.graded:  # the grades the model learnt, scaled by the largest
            values = list(getattr(self.loaded.model.config, GRADES, None) or [0, 1])
        elif not self.loaded.problem.classes:
            values = []
        elif values is None:
            first = ds[0][column] if len(ds) else None
            first = first[0] if isinstance(first, list) and first else first
            values = list(range(len(names))) if isinstance(first, int) else names
        return LabelSpace(
            values=values,
            names=names,
            source=f"the labels of {self.loaded.model_id}",
            problem_type=problem_type,
            delimiter=self.trained_with.get("label_delimiter"),
        )


def load_saved(checkpoint_dir: str, device: str = "cpu", dtype: str = precision.FP32) -> SavedModel:
    """Any servable folder, cast to `dtype` as predict and the service cast it."""
    loaded = load_model(checkpoint_dir, device=device, dtype=dtype)
    recorded = loaded.metrics or {}
    return SavedModel(loaded, recorded.get("config", {}), recorded.get("label_values"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    args = arguments.evaluate().parse_args(argv)
    preset = presets()[args.preset] if args.preset else {}  # defaults < preset < flags, as in training
    args.test_file = preset.get("test_file", args.test_file)  # --preset and --test_file exclude each other
    if args.mixed_precision is None:
        args.mixed_precision = preset.get("mixed_precision", precision.AUTO)
    return args


def load_split(args: argparse.Namespace, saved: SavedModel, cfg: TrainConfig) -> tuple[datasets.Dataset, str]:
    if args.preset:
        ensure_smoke_assets()  # the preset's test_file, built on first use
    if not (args.test_file or args.dataset_name or args.preset) and saved.trained_with.get("train_file"):
        return own_split(saved.trained_with)
    if args.test_file:
        ds, source = load_file(args.test_file), args.test_file
    else:
        name = args.dataset_name or "ag_news"
        ensure_hub_or_offline(needs_hub=not Path(name).is_dir())
        ds, source = hub_split(load_hub(name, args.dataset_config_name), name, args.split), f"{name}[{args.split}]"
    require_columns(ds, source, [cfg.label_column], LABEL_FLAG)
    return labelled(ds, source, cfg, saved.labels_for(ds, cfg.label_column)), source


def own_split(trained_with: dict) -> tuple[datasets.Dataset, str]:
    """The run's own held-out data: its test file, else the validation rows it held out of its files (the same
    seed and fraction: the same rows)."""
    run = TrainConfig(**trained_with)
    for path in (run.test_file, run.validation_file, run.train_file):
        if path and not Path(path).is_file():
            raise DataError(
                f"no --test_file given, and the data this model was trained on is not here ({path}): pass --test_file"
            )
    splits = load_splits(run)
    if splits.test is not None:
        return splits.test, run.test_file
    held = run.validation_file or f"{run.train_file} (the {len(splits.validation)} rows held out for validation)"
    return splits.validation, held


def evaluate_checkpoint(args: argparse.Namespace, accelerator: Accelerator) -> dict:
    root = Path(args.checkpoint_dir)
    saved = load_saved(str(root), str(accelerator.device), args.mixed_precision)
    cfg = saved.data_config(args)
    metrics = MetricSuite(saved.loaded.problem, saved.loaded.labels, args.extra_metrics)
    tokenizer = saved.loaded.tokenizer
    long_text = arguments.long_text_for(saved.loaded, args)

    def load() -> tuple:  # the main process tokenizes and caches; the others read it
        split, source = load_split(args, saved, cfg)
        texts, labels = split["text"], split["labels"]  # for the reports: tokenizing drops the text
        pairs = split["text_pair"] if "text_pair" in split.column_names else None
        tokenized = tokenize(split, tokenizer, cfg.max_length, "evaluation", long_text=long_text)
        return tokenized, source, texts, labels, pairs

    split, source, texts, labels, pairs = main_first(accelerator, load)
    model, loader = accelerator.prepare(
        saved.loaded.model, make_eval_loader(split, tokenizer, args.per_device_eval_batch_size)
    )
    scored, results, report = score(accelerator, model, loader, metrics, long_text=long_text)
    if not torch.equal(scored.labels, torch.tensor(labels, dtype=scored.labels.dtype)):
        raise RuntimeError("gathered results are not in the split's row order")  # the reports depend on it
    evaluation = {
        "checkpoint_dir": str(root),
        "model": described_model(saved),
        "data": source,
        "problem_type": saved.loaded.problem.name,
        "world_size": accelerator.num_processes,
        "max_length": cfg.max_length,
        "long_text": long_text.config_fields(),
        "metrics": results,
        **({"per_class": report["per_class"]} if "per_class" in report else {}),
        "files": [files.EVAL_RESULTS, *reports.written_for(saved.loaded.problem.name)],
    }
    evaluation.update(beside_the_metrics(saved.loaded, scored))
    if "review_band" in evaluation:
        evaluation["files"].append(files.REVIEW_PNG)
    teacher = args.teacher or recorded_teacher(root)
    if teacher:  # a distilled student: its teacher's figures and their agreement on the same texts
        figures = functools.partial(teacher_figures, teacher, args, saved.loaded, scored, (texts, pairs), metrics)
        evaluation["teacher"] = decided_on_main(accelerator, figures)  # scored once, not on every process
    if "confusion_matrix" in report:
        evaluation["confusion_matrix"] = {
            "labels": saved.loaded.labels,
            "rows_true_columns_predicted": report["confusion_matrix"],
        }
    logger.info(
        "%s on %s (%d processes):\n%s",
        root,
        source,
        accelerator.num_processes,
        reports.report_table(report.get("per_class", {}), results),
        main_process_only=True,
    )
    unchanged(accelerator, saved.loaded)
    if accelerator.is_main_process:
        write_evaluation(root, evaluation, texts, scored, saved.loaded)
    return evaluation


def beside_the_metrics(loaded: LoadedModel, scored: Scored) -> dict:
    """How far the scores are from probabilities; inside a review band, the share decided and how right it is."""
    found = {}
    scale = calibration.scale_for(loaded.problem.name)
    if scale is not None:
        applied = getattr(loaded.model.config, calibration.CONFIG_FIELD, None) if loaded.model else None
        ece = scale.error(scored.scores, scored.labels)
        found["calibration"] = {"ece": ece, "bins": calibration.BINS, "applied": applied}
    if loaded.problem.band:
        measured = review.measured(loaded.problem, scored.scores, scored.labels)
        found["review_band"] = {"target_precision": loaded.problem.review_precision, **measured}
    return found


def recorded_teacher(root: Path) -> str | None:
    """The teacher a distilled student's distillation.json names, where its folder is still there."""
    try:
        named = json.loads((root / files.DISTILLATION).read_text(encoding="utf-8"))["teacher"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if isinstance(named, str) and Path(named).is_dir():
        return named
    logger.info("%s names its teacher %r, which is not a folder here: pass --teacher to compare them", root, named)
    return None


def teacher_figures(
    where: str, args: argparse.Namespace, student: LoadedModel, scored: Scored, inputs: tuple, metrics
) -> dict:
    """The teacher on the evaluated texts: its metrics, and how far the student agrees (contract/agreement.py)."""
    teacher = load_model(where, device=str(student.device), dtype=args.mixed_precision)
    if why := agreement.other_task(teacher, student):
        raise CheckpointError(f"teacher: {why}")
    texts, pairs = inputs
    logits = agreement.logits_of(teacher, list(texts), None if pairs is None else list(pairs))
    results, _ = metrics.compute(teacher.problem.scores(logits), scored.labels, teacher.problem.thresholds)
    measured = agreement.measure(teacher.problem, scored.logits, logits)
    headline = ", ".join(f"{name} {results[name]:.4f}" for name in teacher.problem.headline if name in results)
    logger.info("Against its teacher %s (%s): %s", where, headline, agreement.said(measured), main_process_only=True)
    return {"checkpoint_dir": where, "metrics": results, "agreement": measured}


def described_model(saved: SavedModel) -> dict:
    """Which weights the results describe, and where training stood."""
    recorded = saved.loaded.metrics or {}
    return {
        "weights_file": saved.loaded.weights_file,
        "sha256": saved.loaded.sha256,
        "best_step": recorded.get("best_step"),
        "global_step": recorded.get("global_step"),
    }


def unchanged(accelerator: Accelerator, loaded: LoadedModel) -> None:
    """Write only if the weights still hold the scored bytes; decided on the main process."""

    def check() -> None:
        path = Path(loaded.weights_file)
        now = file_sha256(path) if path.is_file() else "missing"
        if now != loaded.sha256:
            raise CheckpointError(
                f"{path} changed while it was evaluated (sha256 {loaded.sha256[:12]} -> {now[:12]}): results not "
                "written; evaluate again once the training run writing the folder has finished"
            )

    decided_on_main(accelerator, check)


def write_evaluation(root: Path, evaluation: dict, texts, scored: Scored, loaded: LoadedModel) -> None:
    """eval_results.json and the problem type's pictures and tables (training/output/reports.py)."""
    write_json(root / files.EVAL_RESULTS, evaluation)
    title = f"{evaluation['data']}: " + "  ".join(
        f"{k} {evaluation['metrics'][k]:.4f}" for k in ("accuracy", "micro_f1", "r2") if k in evaluation["metrics"]
    )
    wrong = reports.write_reports(
        root, reports.Evaluated(texts, scored, loaded.problem, loaded.labels, evaluation, title)
    )
    if "review_band" in evaluation:
        curve = review.curve(loaded.problem, scored.scores, scored.labels)
        reports.write_review_band(root / files.REVIEW_PNG, curve, evaluation, title)
    logger.info("Wrote %s in %s (%d rows in its error table)", ", ".join(evaluation["files"]), root, wrong)


def cli(argv: list[str] | None = None) -> int:
    setup_logging()
    args = parse_args(argv)
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    # no autocast: the weights are cast, as in predict and the service
    accelerator = Accelerator(cpu=device_type == "cpu")
    return run_command(lambda: evaluate_checkpoint(args, accelerator), accelerator)


if __name__ == "__main__":
    sys.exit(cli())
