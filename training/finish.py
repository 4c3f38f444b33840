"""After the loop, on every rank: the best model back, scored on validation, calibrated (--calibration), tested; then
metrics.json, curves, the model card, the runtime export and the upload. Called by train.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types
from dataclasses import replace
from pathlib import Path

import torch
from accelerate.logging import get_logger

from contract import files, problem_types
from contract.errors import UserError
from contract.problem_types import ProblemType
from training import calibration
from training.collective import decided_on_main
from training.loop import format_metrics
from training.output import model_card, reports
from training.output.atomic import write_json
from training.output.resume import ResumeError
from training.push import push
from training.run import Run, run_summary
from training.scoring import review
from training.scoring.metrics import Scored, say_one_sided
from training.scoring.split import score
from training.speed.capture import eager
from training.weights import edit_weights

logger = get_logger(__name__)


def finish(run: Run, started: float) -> dict:
    """The best model tested and calibrated, every report written, exported and pushed when asked: the summary."""
    cfg, accelerator = run.cfg, run.accelerator
    speed = run.throughput.summary(accelerator)
    logger.info(
        "Training speed: %.1f examples/s, %.0f tokens/s (padding %.1f%%), %.1f s; peak memory %.0f MB per process",
        speed["examples_per_second"],
        speed["tokens_per_second"],
        100 * speed["padding_fraction"],
        speed["train_seconds"],
        speed["peak_memory_mb_per_process"],
    )
    test_metrics, calibrated, found, band = score_best_model(run)
    summary = run_summary(run, test_metrics, time.time() - started)
    summary["calibration"] = calibrated
    summary["review_band"] = band
    summary["one_sided_labels"] = found  # labels predicted always or never
    summary["throughput"] = speed
    summary["compilation"] = run.compiled.summary()
    if run.graphs is not None:
        summary["compilation"]["captured_graphs"] = run.graphs.captured
    if accelerator.is_main_process:
        write_json(run.out.path(files.METRICS), summary)
        reports.write_training_curves(run.out.root, run.progress)
        model_card.write_model_card(run.out.root, summary, cfg.hub_model_id)
    if cfg.export_runtime != "none":
        decided_on_main(accelerator, lambda: export(run.out.root, cfg.export_runtime))
    if cfg.push_to_hub and accelerator.is_main_process:
        push(run.out.root, cfg.hub_model_id, cfg.hub_private_repo)
    if accelerator.is_main_process and not cfg.keep_states:
        run.out.remove_states()
    accelerator.wait_for_everyone()  # the others wait for the upload
    size = reports.folder_size(run.out.root, kept_states=cfg.keep_states)
    logger.info(reports.next_steps(cfg, run.progress.best_step, run.progress.best_metric, test_metrics, size))
    return summary


def score_best_model(run: Run) -> tuple[dict | None, dict, dict, dict | None]:
    """The best model back, scored on validation, calibrated and its review band fitted when asked, then on test:
    (test metrics, calibration, one-sided labels, review band)."""
    run.out.restore_best(run.model)
    model, long_text = eager(run.model), run.cfg.long_text_rule()
    validation, _, _ = score(run.accelerator, model, run.loaders.validation, run.metrics, long_text=long_text)
    best_thresholds = (run.progress.best_validation or {}).get("thresholds")
    found = say_one_sided(run.metrics.problem, validation, best_thresholds, run.splits.label_names)
    calibrated, folded = calibrate(run, validation)
    thresholds = calibrated.get("thresholds") or best_thresholds  # moved with the temperatures
    decider = replace(run.metrics.problem, thresholds=tuple(thresholds or run.metrics.problem.thresholds))
    band = None
    if run.cfg.review_precision is not None:  # scored again only where temperatures changed the scores
        if folded:
            validation = score(run.accelerator, model, run.loaders.validation, run.metrics, long_text=long_text)[0]
        decider, band = fit_review_band(run, validation, decider)
    if folded or decider.band:  # config.json carries the temperatures and the band
        run.out.save_model(run.model, run.tokenizer, run.cfg.export_hf_format)
    if run.loaders.test is None:
        return None, calibrated, found, band
    scored, results, _ = score(run.accelerator, model, run.loaders.test, run.metrics, thresholds, long_text)
    calibration.add_test_errors(calibrated, scored, run.objective.problem.name)
    if decider.band:
        band["test"] = review.measured(decider, scored.scores, scored.labels)
        logger.info("Review band on test: %s", review.said(band["test"]))
    logger.info("Test (best model, step %s): %s", run.progress.best_step, format_metrics(results))
    return results, calibrated, found, band


def fit_review_band(run: Run, validation: Scored, decider: ProblemType) -> tuple[ProblemType, dict]:
    """--review_precision: the band fitted on validation as the calibrated model scores it, recorded in config.json;
    nothing on too few texts, said. (The problem type with its band, metrics.json's record.)"""
    precision = run.cfg.review_precision
    if len(validation.labels) < review.FEWEST_TEXTS:
        logger.warning("Review band: not fitted: %d validation texts, under %d (hold out more with "
                       "--validation_split)", len(validation.labels), review.FEWEST_TEXTS)  # fmt: skip
        return decider, {"precision": precision, "too_few": len(validation.labels)}
    ranges = review.fit(decider, validation.scores, validation.labels, precision)
    decider, record = replace(decider, band=tuple(map(tuple, ranges))), review.record(precision, ranges)
    unwrapped = run.accelerator.unwrap_model(run.model, keep_torch_compile=False)
    setattr(unwrapped.config, problem_types.REVIEW_BAND, record)
    measured = review.measured(decider, validation.scores, validation.labels)
    logger.info("Review band: fitted for precision %s on %d validation texts: %s", precision,
                len(validation.labels), review.said(measured))  # fmt: skip
    return decider, {**record, "validation": measured}


def export(root: Path, runtime: str) -> None:
    """The best model converted by the service's own command, in its own process; a failure is one line."""
    command = [sys.executable, "-m", "inference.export", str(root), "--runtime", runtime]
    project = str(Path(__file__).resolve().parents[1])  # inference/ importable without installing
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [project, os.environ.get("PYTHONPATH")]))}
    code = subprocess.run(command, env=env, check=False).returncode
    if code != 0:
        raise UserError(f"export_runtime: {' '.join(command[1:])} failed (exit {code}; its log is above)")


def saved_calibration(root: Path) -> dict:
    """config.json's calibration record, or {}."""
    path = root / files.CONFIG
    if not path.is_file():
        return {}
    record = json.loads(path.read_text()).get(calibration.CONFIG_FIELD)
    try:
        return problem_types.calibration_of(types.SimpleNamespace(**{calibration.CONFIG_FIELD: record}))
    except problem_types.ProblemTypeError as exc:
        raise ResumeError(f"{path}: {exc}") from None


def calibrate(run: Run, validation: Scored) -> tuple[dict, bool]:
    """--calibration on the best model, on every rank: fit, fold in where it helps, move thresholds. (The record,
    whether temperatures were folded in now: the model is saved again.)"""
    unwrapped = run.accelerator.unwrap_model(run.model, keep_torch_compile=False)
    if run.cfg.calibration == calibration.NONE:
        setattr(unwrapped.config, calibration.CONFIG_FIELD, {"method": calibration.NONE})
        return {"method": calibration.NONE}, False
    scale, labels = calibration.scale_for(run.objective.problem.name), validation.labels
    kept, logits, measured = saved_calibration(run.out.root), validation.logits, None
    if kept.get("method") == calibration.TEMPERATURE:
        temperatures = calibration.Scale.temperatures(kept)
        logits = logits.double() * torch.tensor(temperatures, dtype=torch.float64)  # as before calibration
        said = calibration.rounded(temperatures)
        logger.info("Calibration: kept, as an earlier run of this folder applied it (T %s)", said)
    else:
        if run.cfg.calibration == calibration.AUTO and (why := calibration.too_few(scale, logits, labels)):
            logger.info("Calibration: not applied (auto): %s; the model stays as trained", why)
            setattr(unwrapped.config, calibration.CONFIG_FIELD, {"method": calibration.NONE})
            return {"method": calibration.NONE, "too_few": why}, False
        temperatures = scale.fit(logits, labels)
        if run.cfg.calibration == calibration.AUTO:
            measured = calibration.held_out(scale, logits, labels, run.cfg.seed)
            if not calibration.helps(measured):
                ece = {"validation": scale.error(scale.probabilities(logits), labels)}
                return {**calibration.not_applied(unwrapped, temperatures, measured), "ece": ece}, False
        layer = calibration.output_layer(unwrapped, len(run.splits.label_names))
        edit_weights(run.accelerator, run.model, lambda w: calibration.fold_temperature(w, layer, temperatures))
        said = calibration.rounded(temperatures), calibration.held_out_figures(measured)
        logger.info("Calibration: temperature %s fitted on validation, folded in%s", *said)
    applied = scale.record(temperatures)
    setattr(unwrapped.config, calibration.CONFIG_FIELD, applied)
    thresholds = (run.progress.best_validation or {}).get("thresholds")
    if thresholds:  # multi-label: the same decisions from the calibrated scores
        applied = {**applied, "thresholds": calibration.moved_thresholds(thresholds, temperatures)}
        setattr(unwrapped.config, problem_types.THRESHOLDS, applied["thresholds"])
    record = {
        **applied,
        "clamped": calibration.say_clamped(temperatures),
        "held_out": measured,
        "bins": calibration.BINS,
        "ece_before": {"validation": scale.error(scale.probabilities(logits), labels)},
        "ece_after": {"validation": scale.error(scale.probabilities(logits, temperatures), labels)},
    }
    return record, kept.get("method") != calibration.TEMPERATURE
