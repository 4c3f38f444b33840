"""Scoring a split on every process at once: what training's validation and test, and `python -m training.evaluate`,
compute. Each rank scores its shard of the windows; `gather_for_metrics` drops the duplicates accelerate adds to even
out the last batch, so the counts are exact with any number of processes; each text's windows are pooled once all
are gathered (contract/long_text.py)."""

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
    """(labels, fp32 logits, text row) of every window of the split, from every rank. gather_for_metrics drops the
    padding duplicates of the last batch, so every rank gets each window exactly once, whichever rank scored it."""
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
    """(scored texts, metrics, per-class report). Every rank scores its shard of the windows; each text's windows are
    pooled once all are gathered (`long_text`'s pooling), so the figures are exact and the same on every rank with
    any number of processes, wherever a text's windows were scored. Multi-label decisions use `thresholds` (default:
    the problem type's); FIT fits one per label on this split first, reported as `thresholds`."""
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
    """The problem type's metrics, the extra metrics, number of texts (and windows) and mean loss over the whole
    split, scored by every rank (every rank gets the same)."""
    return score(accelerator, model, loader, metrics, thresholds, long_text)[1]
