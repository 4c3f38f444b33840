"""Calibrated scores carried in the weights (--calibration temperature): after the best model is chosen, one
temperature T is fitted on the validation split (the T that minimises the negative log-likelihood of softmax(z / T)),
and folded into the final linear layer (weight and bias divided by T). Every consumer of the checkpoint (the
service, transformers' pipeline, any TEI client, the ONNX / OpenVINO runtimes, the int8 guard) then computes
calibrated probabilities with no code of its own, and the argmax is unchanged: z / T keeps every row's order.

The expected calibration error (ECE, 15 equal-width confidence bins: the gap between confidence and accuracy,
weighted by each bin's share of the texts) is measured before and after; metrics.json records both, and
`python -m training.evaluate` draws the reliability diagram (calibration.png).
"""

from __future__ import annotations

import math

import torch

BINS = 15
NONE, TEMPERATURE = "none", "temperature"
CONFIG_FIELD = "calibration"  # config.json: {"method": ..., "temperature": T}


def fit_temperature(log_probs: torch.Tensor, labels: torch.Tensor) -> float:
    """The T > 0 minimising the mean NLL of softmax(log_probs / T) (log-probabilities are logits up to a per-row
    constant, which softmax ignores), found by L-BFGS on log T in float64."""
    scores, targets = log_probs.double(), labels.long()
    log_t = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([log_t], lr=0.1, max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(scores / log_t.exp(), targets)
        loss.backward()
        return loss

    optimizer.step(closure)
    temperature = float(log_t.detach().exp())
    return min(max(temperature, 0.05), 20.0) if math.isfinite(temperature) else 1.0


def expected_calibration_error(probs: torch.Tensor, labels: torch.Tensor, bins: int = BINS) -> float:
    """Sum over equal-width confidence bins of (share of texts) x |accuracy - mean confidence| (top label)."""
    points = reliability(probs, labels, bins)
    return sum(count * abs(accuracy - confidence) for confidence, accuracy, count in points) / len(labels)


def reliability(probs: torch.Tensor, labels: torch.Tensor, bins: int = BINS) -> list[tuple[float, float, int]]:
    """(mean confidence, accuracy, texts) of each non-empty bin: the reliability diagram's points."""
    confidence, predicted = probs.double().max(dim=-1)
    correct = (predicted == labels).double()
    which = torch.clamp((confidence * bins).ceil().long() - 1, 0, bins - 1)
    return [
        (confidence[which == b].mean().item(), correct[which == b].mean().item(), int((which == b).sum()))
        for b in range(bins)
        if (which == b).any()
    ]


def output_layer(model: torch.nn.Module, num_labels: int) -> torch.nn.Linear:
    """The last linear layer producing the `num_labels` logits (DistilBERT and BERT: classifier; Qwen, Llama:
    score; RoBERTa: classifier.out_proj); with LoRA, the head's trained copy (peft's modules_to_save)."""
    found = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.out_features == num_labels]
    if not found:
        raise ValueError(f"no linear layer with {num_labels} outputs to fold a temperature into")
    trained = [m for m in found if any(p.requires_grad for p in m.parameters())]
    return (trained or found)[-1]


@torch.no_grad()
def fold_temperature(model: torch.nn.Module, num_labels: int, temperature: float) -> None:
    """Divide the output layer's weight and bias by `temperature`: the model's logits become z / T."""
    layer = output_layer(model, num_labels)
    layer.weight.div_(temperature)
    if layer.bias is not None:
        layer.bias.div_(temperature)
