"""Scoring a split on every process at once: validation, test and `agnews evaluate`. Exact with any number of processes:
gather_for_metrics drops the duplicates that even out the last batch.
"""

from __future__ import annotations

import torch
from accelerate import Accelerator

from contract.long_text import LongText
from training.data.batching import model_inputs
from training.objective import Objective
from training.scoring.metrics import MetricSuite, Scored, fit_thresholds

FIT = "fit"  # score(thresholds=FIT): fit multi-label thresholds on the split scored (validation)


@torch.no_grad()
def gather_windows(accelerator: Accelerator, model, loader) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(labels, logits, row) of every window, from every rank, each once."""
    was_training = model.training
    model.eval()
    kept: list[list[torch.Tensor]] = [[], [], []]
    for batch in loader:
        logits = model(**model_inputs(batch)).logits.float()
        for values, gathered in zip(kept, accelerator.gather_for_metrics((batch["labels"], logits, batch["document"]))):
            values.append(gathered.cpu())
    model.train(was_training)
    return tuple(torch.cat(values) for values in kept)


def score(
    accelerator: Accelerator, model, loader, metrics: MetricSuite, thresholds=None, long_text: LongText | None = None
) -> tuple[Scored, dict, dict]:
    """(texts scored, metrics, report), windows pooled per text after the gather: the same on every rank."""
    labels, logits, documents = gather_windows(accelerator, model, loader)
    texts = int(documents.max()) + 1
    pooled = (long_text or LongText()).pool(logits, documents, texts)
    text_labels = torch.empty((texts, *labels.shape[1:]), dtype=labels.dtype)
    text_labels[documents] = labels  # every window carries its text's label
    losses = Objective(metrics.problem).per_example(pooled, text_labels)
    windows = torch.bincount(documents, minlength=texts)
    scored = Scored(text_labels, metrics.problem.scores(pooled), losses, windows, pooled)
    if thresholds == FIT:
        thresholds = fit_thresholds(scored.scores, scored.labels)
    results, report = metrics.compute(scored.scores, scored.labels, thresholds or ())
    results.update(num_examples=texts, loss=scored.losses.mean().item())
    if long_text is not None and long_text.chunked:
        results["num_windows"] = len(documents)
    if metrics.problem.thresholded:
        results["thresholds"] = list(thresholds or metrics.problem.thresholds)
    return scored, results, report


def evaluate(
    accelerator: Accelerator, model, loader, metrics: MetricSuite, thresholds=None, long_text: LongText | None = None
) -> dict:
    """Metrics, text counts and mean loss of the whole split."""
    return score(accelerator, model, loader, metrics, thresholds, long_text)[1]
