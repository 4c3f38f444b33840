"""Scoring a split on every process at once: validation, test and `agnews evaluate`. Exact with any number of processes:
gather_for_metrics drops the duplicates that even out the last batch.
"""

from __future__ import annotations

import torch
from accelerate import Accelerator

from contract.long_text import LongText
from training.data.batching import model_inputs
from training.data.reading import QUERY
from training.objective import Objective
from training.scoring.metrics import MetricSuite, Scored, fit_thresholds

FIT = "fit"  # score(thresholds=FIT): fit multi-label thresholds on the split scored (validation)


@torch.no_grad()
def gather_windows(accelerator: Accelerator, model, loader) -> dict[str, torch.Tensor]:
    """Every window's labels, logits, document (its text's row) and query (rerankers), from every rank, each once."""
    was_training = model.training
    model.eval()
    kept: dict[str, list[torch.Tensor]] = {}
    for batch in loader:
        values = {"labels": batch["labels"], "logits": model(**model_inputs(batch)).logits.float()}
        values.update({key: batch[key] for key in ("document", QUERY) if key in batch})
        for key, gathered in accelerator.gather_for_metrics(values).items():
            kept.setdefault(key, []).append(gathered.cpu())
    model.train(was_training)
    return {key: torch.cat(parts) for key, parts in kept.items()}


def per_text(values: torch.Tensor, documents: torch.Tensor, texts: int) -> torch.Tensor:
    """A per-window value every window of a text shares, once per text."""
    out = torch.empty((texts, *values.shape[1:]), dtype=values.dtype)
    out[documents] = values
    return out


def score(
    accelerator: Accelerator, model, loader, metrics: MetricSuite, thresholds=None, long_text: LongText | None = None
) -> tuple[Scored, dict, dict]:
    """(texts scored, metrics, report), windows pooled per text after the gather: the same on every rank."""
    windows = gather_windows(accelerator, model, loader)
    documents = windows["document"]
    texts = int(documents.max()) + 1
    pooled = (long_text or LongText()).pool(windows["logits"], documents, texts)
    text_labels = per_text(windows["labels"], documents, texts)
    queries = per_text(windows[QUERY], documents, texts) if QUERY in windows else None
    losses = Objective(metrics.problem).per_example(pooled, text_labels)
    counts = torch.bincount(documents, minlength=texts)
    scored = Scored(text_labels, metrics.problem.scores(pooled), losses, counts, pooled)
    if thresholds == FIT:
        thresholds = fit_thresholds(scored.scores, scored.labels)
    results, report = metrics.compute(scored.scores, scored.labels, thresholds or (), queries)
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
