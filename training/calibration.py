"""Calibrated scores carried in the weights (--calibration): temperatures fitted on validation after the best model is
chosen, folded into the output layer, decisions unchanged. Called by finish.py; docs/checkpoints.md tells more.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from accelerate.logging import get_logger

from contract import problem_types
from contract.problem_types import PROBLEM_TYPES

logger = get_logger(__name__)  # the main process says it

BINS = 15
NONE, TEMPERATURE, AUTO = "none", "temperature", "auto"
CONFIG_FIELD = (
    problem_types.CALIBRATION
)  # config.json: {"method": ..., "temperature": T} or {..., "temperatures": [T_j]}
LIMITS = (0.05, 20.0)  # a fitted temperature is kept within these
# auto's bar: held-out NLL or ECE lower by this share, neither higher
MARGIN = 0.02
FEWEST_TEXTS, FEWEST_PER_CLASS = 100, 10  # auto fits nothing on less: a temperature from 5-text halves is noise


def too_few(scale: Scale, logits: torch.Tensor, labels: torch.Tensor) -> str | None:
    """Why a validation split is too small for auto to fit a temperature, or None."""
    if len(labels) < FEWEST_TEXTS:
        return f"{len(labels)} validation texts, under {FEWEST_TEXTS}"
    outputs = logits.shape[-1]
    counts = labels.long().sum(0) if scale.per_label else torch.bincount(labels.long(), minlength=outputs)
    if int(counts.min()) < FEWEST_PER_CLASS:
        kind = "label" if scale.per_label else "class"
        return f"a {kind} with {int(counts.min())} validation texts, under {FEWEST_PER_CLASS}"
    return None


@dataclass(frozen=True)
class Scale:
    """How one problem type's scores are calibrated: logits, loss and error. `per_label`: a temperature per output."""

    per_label: bool

    def probabilities(self, logits: torch.Tensor, temperatures: Sequence[float] = (1.0,)) -> torch.Tensor:
        """Scores of logits / T, in float64."""
        scaled = logits.double() / torch.tensor(temperatures, dtype=torch.float64)
        return scaled.sigmoid() if self.per_label else scaled.softmax(-1)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.per_label:  # independent labels: minimised one by one
            return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype), reduction="none").mean(0).sum()
        return F.cross_entropy(logits, labels.long())

    def fit(self, logits: torch.Tensor, labels: torch.Tensor) -> list[float]:
        """Temperatures minimising the loss of logits / T (L-BFGS on log T)."""
        log_t = torch.zeros(logits.shape[-1] if self.per_label else 1, dtype=torch.float64, requires_grad=True)
        optimizer = torch.optim.LBFGS([log_t], lr=0.1, max_iter=200, line_search_fn="strong_wolfe")
        scores = logits.double()

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = self.loss(scores / log_t.exp(), labels)
            loss.backward()
            return loss

        optimizer.step(closure)
        return [min(max(t, LIMITS[0]), LIMITS[1]) if math.isfinite(t) else 1.0 for t in log_t.detach().exp().tolist()]

    def error(self, probs: torch.Tensor, labels: torch.Tensor) -> float:
        return expected_calibration_error(*self.top_label(probs, labels))

    def points(self, probs: torch.Tensor, labels: torch.Tensor) -> list[tuple[float, float, int]]:
        return reliability(*self.top_label(probs, labels))

    def top_label(self, probs: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(probabilities, labels) the error counts; each label a yes/no for sigmoids."""
        if not self.per_label:
            return probs, labels
        yes = probs.double().reshape(-1)
        return torch.stack([1 - yes, yes], dim=-1), labels.reshape(-1).long()

    def record(self, temperatures: Sequence[float]) -> dict:
        """config.json's calibration field once these temperatures are folded in."""
        if self.per_label:
            return {"method": TEMPERATURE, "temperatures": list(temperatures)}
        return {"method": TEMPERATURE, "temperature": temperatures[0]}

    @staticmethod
    def temperatures(record: dict) -> list[float]:
        return list(record["temperatures"]) if "temperatures" in record else [record["temperature"]]


def clamped(temperatures: Sequence[float]) -> list[int]:
    """Outputs whose temperature hit a bound: too little or degenerate validation."""
    return [i for i, t in enumerate(temperatures) if t in LIMITS]


def held_out(scale: Scale, logits: torch.Tensor, labels: torch.Tensor, seed: int) -> dict:
    """Temperatures fitted on one half of validation, measured on the other, both ways: NLL and ECE before and after."""
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    halves = (order[: len(order) // 2], order[len(order) // 2 :])
    totals = {"nll_before": 0.0, "nll_after": 0.0, "ece_before": 0.0, "ece_after": 0.0}
    for fit_on, measure_on in (halves, halves[::-1]):
        temperatures = scale.fit(logits[fit_on], labels[fit_on])
        scaled = logits[measure_on].double() / torch.tensor(temperatures, dtype=torch.float64)
        with torch.no_grad():
            totals["nll_before"] += scale.loss(logits[measure_on].double(), labels[measure_on]).item() / 2
            totals["nll_after"] += scale.loss(scaled, labels[measure_on]).item() / 2
        totals["ece_before"] += scale.error(scale.probabilities(logits[measure_on]), labels[measure_on]) / 2
        totals["ece_after"] += (
            scale.error(scale.probabilities(logits[measure_on], temperatures), labels[measure_on]) / 2
        )
    return totals


def helps(measured: dict) -> bool:
    """auto keeps temperatures that help held-out texts by MARGIN."""
    ratios = [measured[f"{m}_after"] / max(measured[f"{m}_before"], 1e-12) for m in ("nll", "ece")]
    return min(ratios) <= 1 - MARGIN and max(ratios) <= 1 + MARGIN


def scale_for(problem_type: str) -> Scale | None:
    """This problem type's calibration; None for regression."""
    temperatures = PROBLEM_TYPES[problem_type].temperatures
    return None if temperatures == problem_types.NONE else Scale(per_label=temperatures == "per_label")


def moved_thresholds(thresholds: Sequence[float], temperatures: Sequence[float]) -> list[float]:
    """Thresholds moved to sigmoid(logit(t) / T): the same decisions after calibration."""
    moved = []
    for t, temperature in zip(thresholds, temperatures, strict=True):
        if t <= 0 or t >= 1:
            moved.append(float(t))
        else:
            moved.append(1 / (1 + math.exp(-math.log(t / (1 - t)) / temperature)))
    return moved


def expected_calibration_error(probs: torch.Tensor, labels: torch.Tensor, bins: int = BINS) -> float:
    """Expected calibration error over equal-width bins (top label)."""
    points = reliability(probs, labels, bins)
    return sum(count * abs(accuracy - confidence) for confidence, accuracy, count in points) / len(labels)


def reliability(probs: torch.Tensor, labels: torch.Tensor, bins: int = BINS) -> list[tuple[float, float, int]]:
    """(confidence, accuracy, texts) per non-empty bin."""
    confidence, predicted = probs.double().max(dim=-1)
    correct = (predicted == labels).double()
    which = torch.clamp((confidence * bins).ceil().long() - 1, 0, bins - 1)
    return [
        (confidence[which == b].mean().item(), correct[which == b].mean().item(), int((which == b).sum()))
        for b in range(bins)
        if (which == b).any()
    ]


def output_layer(model: torch.nn.Module, num_labels: int) -> str:
    """The last linear layer giving the logits (with LoRA, the head's trained copy)."""
    found = [
        (n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m.out_features == num_labels
    ]
    if not found:
        raise ValueError(f"no linear layer with {num_labels} outputs to fold a temperature into")
    trained = [(n, m) for n, m in found if any(p.requires_grad for p in m.parameters())]
    return (trained or found)[-1][0]


@torch.no_grad()
def fold_temperature(weights: dict[str, torch.Tensor], layer: str, temperature: float | Sequence[float]) -> None:
    """Divide the output layer of `weights` by `temperature`: logits become z / T."""
    weight = weights[f"{layer}.weight"]
    divisor = torch.tensor(temperature, dtype=weight.dtype, device=weight.device).reshape(-1)
    weight.div_(divisor[:, None])
    if f"{layer}.bias" in weights:
        weights[f"{layer}.bias"].div_(divisor)


def not_applied(model: torch.nn.Module, temperatures: list[float], measured: dict) -> dict:
    """auto: no temperature helped, so the model stays as trained."""
    logger.info(
        "Calibration: not applied (auto): temperature %s fitted on validation; fitted on either half, it did not help "
        "the other%s",
        rounded(temperatures),
        held_out_figures(measured),
    )
    setattr(model.config, CONFIG_FIELD, {"method": NONE})
    return {"method": NONE, "fitted": list(temperatures), "clamped": clamped(temperatures), "held_out": measured}


def held_out_figures(measured: dict | None) -> str:
    if measured is None:
        return ""
    return (
        f" (held-out halves: NLL {measured['nll_before']:.4f} -> {measured['nll_after']:.4f}, ECE "
        f"{measured['ece_before']:.4f} -> {measured['ece_after']:.4f})"
    )


def say_clamped(temperatures: list[float]) -> list[int]:
    at_bound = clamped(temperatures)
    if at_bound:
        logger.warning(
            "Calibration: %d temperature(s) at a bound of %s (the fit wanted further: a small validation split or "
            "degenerate scores); outputs %s",
            len(at_bound),
            LIMITS,
            at_bound[:10],
        )
    return at_bound


def rounded(numbers: list[float]) -> str:
    return ", ".join(f"{n:.3f}" for n in numbers)


def add_test_errors(calibrated: dict, scored, problem_type: str) -> None:
    """Test-split calibration error beside validation's."""
    scale = scale_for(problem_type)
    if "ece" in calibrated:  # no temperature kept: the raw scores' error
        calibrated["ece"]["test"] = scale.error(scored.scores, scored.labels)
    if "ece_after" in calibrated:
        undone = [1 / t for t in Scale.temperatures(calibrated)]  # the logits are the calibrated ones
        calibrated["ece_before"]["test"] = scale.error(scale.probabilities(scored.logits, undone), scored.labels)
        calibrated["ece_after"]["test"] = scale.error(scale.probabilities(scored.logits), scored.labels)
