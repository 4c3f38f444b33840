"""The problem type of a model: single-label, multi-label, regression or reranking, one class each, with its outputs and
thresholds as config.json carries them. Training, evaluation, prediction and the service ask it.

A new type is one subclass, registered in PROBLEM_TYPES.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Protocol

import torch
import torch.nn.functional as F

from contract import scoring
from contract.errors import UserError

SINGLE = "single_label_classification"
MULTI = "multi_label_classification"
REGRESSION = "regression"
RERANKING = "reranking"  # ours: config.json leaves problem_type out, as cross-encoders on the Hub do, and lists GRADES

SOFTMAX, SIGMOID, NONE = scoring.SOFTMAX, scoring.SIGMOID, scoring.NONE
FUNCTIONS = (SOFTMAX, SIGMOID, NONE)

TIE_MARGIN = 0.02  # fp32's own near-ties are left out
REGRESSION_TOLERANCE = 0.1  # in standard deviations of fp32's outputs
THRESHOLDS = "decision_thresholds"  # config.json: one per label, multi-label models only
DEFAULT_THRESHOLD = 0.5
GRADES = "relevance_grades"  # config.json: a reranker's training grades; the largest is relevance 1
CALIBRATION = "calibration"  # config.json: {"method": "none"} or {"method": "temperature", "temperature(s)": ...}
REVIEW_BAND = "review_band"  # config.json: {"precision": P, "ranges": [[low, high], ...]}, fitted by --review_precision


class ProblemTypeError(UserError, ValueError):
    """A problem type, thresholds or calibration that cannot be served."""


class LabelReader(Protocol):
    """What a problem type reads label cells through: training/data/labels.py LabelSpace."""

    count: int  # classes known from the training data

    def label_value(self, value: Any, row: int, source: str) -> Any: ...

    def class_id(self, value: Any, row: int, source: str) -> int: ...

    def row_values(self, labels: Any, row: int, source: str) -> list: ...

    def target(self, value: Any, row: int, source: str) -> float: ...

    def grade(self, value: Any, row: int, source: str) -> float: ...

    def relevance(self, value: Any, row: int, source: str) -> float: ...


def scored(logits: torch.Tensor, function: str) -> torch.Tensor:
    """Scores from fp32 logits (contract/scoring.py: the same on NumPy arrays, for the service)."""
    function = scoring.applied(function, logits.shape[-1])
    if function == SIGMOID:
        return logits.sigmoid()
    if function == SOFTMAX:
        return logits.softmax(dim=-1)
    return logits


@dataclass(frozen=True)
class ProblemType:
    """The interface and the configured outputs."""

    num_labels: int = 1
    thresholds: tuple[float, ...] = ()  # multi-label: one per label, DEFAULT_THRESHOLD each unless given
    band: tuple[tuple[float, float], ...] = ()  # the review band's [low, high) score ranges (contract/scoring.decide)
    review_precision: float | None = None  # the precision the band was fitted for

    name: ClassVar[str]  # transformers' config.problem_type
    function: ClassVar[str]  # the default scoring function: the text-classification pipeline's rule
    classes: ClassVar[bool] = True  # labels are classes (else: a value, one output)
    label_lists: ClassVar[bool] = False  # or a delimited string
    graded: ClassVar[bool] = False  # labels are relevance grades, ranked per query (GRADES in config.json)
    thresholded: ClassVar[bool] = False  # decisions at per-label thresholds (config.json decision_thresholds)
    decides: ClassVar[str] = "none"  # the rule of `decisions`, for torch-free readers (contract/scoring.py decided)
    headline: ClassVar[tuple[str, ...]]  # shown first by cards, plots and summaries
    selection: ClassVar[str]  # the default metric_for_best_model
    metric_sets: ClassVar[tuple[str, ...]]  # the built-in metrics (training/scoring/builtin.py)
    reports: ClassVar[tuple[str, ...]]  # the tables and pictures training.evaluate draws (output/reports.py)
    card_tag: ClassVar[str | None] = None  # the model card's tag beside text-classification
    temperatures: ClassVar[str] = NONE  # --calibration temperature: "one" for all outputs, "per_label", or none
    groups_by_length: ClassVar[bool] = True  # --group_by_length's default
    class_weights: ClassVar[str] = "none"  # --class_weights auto
    threshold_strategy: ClassVar[str] = "fixed"  # --threshold_strategy auto
    keeps_fp32: ClassVar[bool] = False  # DTYPE=auto serves fp32 on a CPU without an optimized runtime

    def __post_init__(self) -> None:
        if self.thresholded and not self.thresholds:
            object.__setattr__(self, "thresholds", (DEFAULT_THRESHOLD,) * self.num_labels)

    @staticmethod
    def named(name: str, num_labels: int = 1, thresholds: tuple[float, ...] = ()) -> ProblemType:
        """The problem type config.json's problem_type (or a run summary's) names."""
        if name not in PROBLEM_TYPES:
            raise ProblemTypeError(f"config.json: problem_type {name!r} is not one of {', '.join(PROBLEM_TYPES)}")
        return PROBLEM_TYPES[name](num_labels, tuple(thresholds))

    @staticmethod
    def of(config: Any) -> ProblemType:
        """The problem type a transformers config describes."""
        num = int(config.num_labels)
        named = getattr(config, "problem_type", None)
        if not named:  # transformers' pipeline reads one output without a name as one sigmoid
            named = SINGLE if num > 1 else RERANKING if getattr(config, GRADES, None) else MULTI
        problem = ProblemType.named(named, num)
        problem.check_outputs(num)
        grades = getattr(config, GRADES, None) if problem.graded else None
        if grades is not None and not (isinstance(grades, list) and len(grades) >= 2 and all(map(_grade, grades))):
            raise ProblemTypeError(f"config.json: {GRADES} must list two or more numbers >= 0 (got {grades!r:.80})")
        given = (getattr(config, THRESHOLDS, None) or ()) if problem.thresholded else ()
        numbers = all(isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t <= 1 for t in given)
        if given and (len(given) != num or not numbers):
            raise ProblemTypeError(f"config.json: {THRESHOLDS} must hold {num} numbers in [0, 1] (got {given!r})")
        problem = replace(problem, thresholds=tuple(float(t) for t in given)) if given else problem
        record = getattr(config, REVIEW_BAND, None)
        return replace(problem, band=problem.band_of(record), review_precision=record and record.get("precision"))

    def band_of(self, record: Any) -> tuple[tuple[float, float], ...]:
        """The review band's ranges config.json records: one on the top score (best) or one per label (thresholds)."""
        if record is None:
            return ()
        wanted = 1 if self.decides == scoring.BEST else self.num_labels if self.decides == scoring.THRESHOLDS else 0
        ranges = record.get("ranges") if isinstance(record, dict) else None
        fitted_for = record.get("precision") if isinstance(record, dict) else None
        if not wanted or not isinstance(ranges, list) or len(ranges) != wanted or not all(map(_range, ranges)):
            raise ProblemTypeError(
                f"config.json: {REVIEW_BAND} must hold {wanted or 'no'} [low, high] range(s) of numbers "
                f"0 <= low <= high for a {self.name} model (got {record!r:.80})"
            )
        if not (_grade(fitted_for) and 0 < fitted_for < 1):
            raise ProblemTypeError(f"config.json: {REVIEW_BAND}'s precision must be a number in (0, 1)")
        return tuple((float(low), float(high)) for low, high in ranges)

    def scores(self, logits: torch.Tensor, function: str | None = None) -> torch.Tensor:
        """Scores by `function`, this type's default when None."""
        return scored(logits, function or self.function)

    def config_fields(self) -> dict[str, Any]:
        """The config fields that record this problem type."""
        fields: dict[str, Any] = {"problem_type": self.name}
        if self.thresholds:
            fields[THRESHOLDS] = list(self.thresholds)
        return fields

    def check_outputs(self, num: int) -> None:
        """ProblemTypeError unless `num` outputs fit this type."""

    def band_record(self) -> dict | None:
        """config.json's review_band, as /info and /v1/models name it; None without a band."""
        return {"precision": self.review_precision, "ranges": [list(r) for r in self.band]} if self.band else None

    def decided(self, scores: torch.Tensor, band: bool = True) -> scoring.Decisions:
        """Each text's decisions by contract/scoring.decide, the review band applied unless `band` is False."""
        return scoring.decide(self.decides, _fp32(scores), self.thresholds, self.band if band else ())

    def decisions(self, scores: torch.Tensor) -> torch.Tensor:
        """What the metrics compare to the references (the band left out): class ids, label booleans, or values."""
        raise NotImplementedError

    def label_matrix(self, values: torch.Tensor, num: int) -> torch.Tensor | None:
        """Decisions or targets as texts x labels booleans; None without classes."""
        return None

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, weights, smoothing: float) -> torch.Tensor:
        """Each example's loss; `weights` per class, or None."""
        raise NotImplementedError

    def batch_loss(self, logits: torch.Tensor, labels: torch.Tensor, weights, smoothing: float) -> torch.Tensor:
        """The mean of weighted per-example losses: the same however a batch is split."""
        return self.loss(logits, labels, weights, smoothing).mean()

    def teacher_loss(self, logits: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
        """Each example's distillation loss against the teacher's scores (what its service answers)."""
        raise NotImplementedError

    def balanced_weights(self, targets: list, count: int) -> torch.Tensor:
        """Weights averaging 1 over the training targets."""
        raise NotImplementedError

    def cell_values(self, value: Any, row: int, source: str, reader: LabelReader) -> list:
        """The class values (reranking: the grade) a label cell holds."""
        raise NotImplementedError

    def encode(self, value: Any, row: int, source: str, reader: LabelReader) -> Any:
        """A label cell as the model's target."""
        raise NotImplementedError

    def metric_inputs(self, decided: torch.Tensor, references: torch.Tensor) -> tuple[list, list]:
        """The metrics' inputs: class ids, 0/1 lists, or values."""
        return decided.tolist(), references.tolist()

    def example(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A tiny split to try metrics on at start."""
        raise NotImplementedError

    def prediction_names(self, labels: list[str]) -> list[str]:
        raise NotImplementedError

    def prediction_values(self, scores: torch.Tensor, labels: list[str]) -> dict[str, Any]:
        """The prediction file's columns, in row order."""
        raise NotImplementedError

    def agreement(self, out: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Agreement with fp32 where fp32 decides clearly; and the ties."""
        raise NotImplementedError

    def agreement_rule(self) -> str:
        raise NotImplementedError


def _fp32(scores: torch.Tensor):
    return scores.detach().float().cpu().numpy()


def _named(matrix, labels: list[str]) -> list[list[str]]:
    return [[labels[j] for j in row.nonzero()[0].tolist()] for row in matrix]


def _per_label_scores(scores: torch.Tensor, labels: list[str]) -> dict[str, Any]:
    return {f"score_{label}": scores[:, i].numpy() for i, label in enumerate(labels)}


class SingleLabel(ProblemType):
    """One class per text: softmax; the top label decides."""

    name, function, decides = SINGLE, SOFTMAX, "best"
    headline, selection = ("accuracy", "macro_f1"), "accuracy"
    metric_sets = ("accuracy", "macro_f1", "classification_report")
    reports = ("confusion_matrix", "calibration", "misclassified")
    temperatures = "one"

    def check_outputs(self, num: int) -> None:
        if num < 2:
            raise ProblemTypeError(f"config.json: a {SINGLE} model needs two or more labels (has {num})")

    def decisions(self, scores: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.decided(scores, band=False).chosen.argmax(axis=1))

    def label_matrix(self, values: torch.Tensor, num: int) -> torch.Tensor:
        return F.one_hot(values.long(), num).bool()

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, weights, smoothing: float) -> torch.Tensor:
        losses = F.cross_entropy(logits.float(), labels, reduction="none", label_smoothing=smoothing)
        return losses * weights[labels] if weights is not None else losses

    def batch_loss(self, logits: torch.Tensor, labels: torch.Tensor, weights, smoothing: float) -> torch.Tensor:
        if weights is None:  # transformers' own loss, exactly
            return F.cross_entropy(logits.float(), labels, label_smoothing=smoothing)
        return super().batch_loss(logits, labels, weights, smoothing)

    def teacher_loss(self, logits: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
        """KL(teacher || student) with both softened at `temperature`, times its square (Hinton et al.'s scale);
        the teacher's probabilities stand for its logits (softmax forgets their shift)."""
        target = F.log_softmax(teacher.float().clamp(min=1e-12).log() / temperature, dim=-1)
        student = F.log_softmax(logits.float() / temperature, dim=-1)
        return F.kl_div(student, target, reduction="none", log_target=True).sum(-1) * temperature**2

    def balanced_weights(self, targets: list, count: int) -> torch.Tensor:
        """Weights by texts / (classes x class texts)."""
        counts = torch.bincount(torch.tensor(targets), minlength=count).double()
        return (len(targets) / (count * counts.clamp(min=1))).float()

    def cell_values(self, value: Any, row: int, source: str, reader: LabelReader) -> list:
        return [reader.label_value(value, row, source)]

    def encode(self, value: Any, row: int, source: str, reader: LabelReader) -> int:
        return reader.class_id(value, row, source)

    def example(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.eye(count), torch.arange(count)

    def prediction_names(self, labels: list[str]) -> list[str]:
        return ["predicted_label", "predicted_score", "decision", *[f"score_{label}" for label in labels]]

    def prediction_values(self, scores: torch.Tensor, labels: list[str]) -> dict[str, Any]:
        """The best label and its score; `decision`: that label, or `review` inside the review band."""
        best, withheld = self.decisions(scores), self.decided(scores).withheld().tolist()
        named = [labels[i] for i in best.tolist()]
        return {
            "predicted_label": named,
            "predicted_score": scores.gather(1, best[:, None]).squeeze(1).numpy(),
            "decision": [scoring.REVIEW if out else label for label, out in zip(named, withheld, strict=True)],
            **_per_label_scores(scores, labels),
        }

    def agreement(self, out: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, int]:
        """The argmax; fp32's near-ties are neither blamed nor credited."""
        top = ref.softmax(-1).topk(2, dim=-1).values
        decided = top[:, 0] - top[:, 1] >= TIE_MARGIN
        same = self.decisions(self.scores(out.float())) == self.decisions(self.scores(ref.float()))
        return same[decided], len(ref) - int(decided.sum())

    def agreement_rule(self) -> str:
        return f"argmax agreement on texts fp32 decides by {TIE_MARGIN} or more"


class MultiLabel(ProblemType):
    """Any labels per text: a sigmoid each, decided at its threshold."""

    name, function, thresholded, label_lists, decides = MULTI, SIGMOID, True, True, "thresholds"
    headline, selection = ("micro_f1", "macro_f1", "subset_accuracy"), "micro_f1"
    metric_sets = ("multilabel",)
    reports = ("calibration", "wrong_label_sets")
    card_tag = "multi-label-classification"
    temperatures = "per_label"
    # both best for micro- and macro-F1 (docs/benchmarks.md, "Rare labels")
    class_weights, threshold_strategy = "balanced", "per_label"

    def decisions(self, scores: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.decided(scores, band=False).chosen)

    def label_matrix(self, values: torch.Tensor, num: int) -> torch.Tensor:
        return values.bool()

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, weights, smoothing: float) -> torch.Tensor:
        """Binary cross-entropy per label, averaged; `weights` are pos_weight."""
        targets = labels.float() * (1 - smoothing) + smoothing / 2
        losses = F.binary_cross_entropy_with_logits(logits.float(), targets, pos_weight=weights, reduction="none")
        return losses.mean(dim=-1)

    def teacher_loss(self, logits: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
        """Binary cross-entropy on the teacher's probability of each label, averaged."""
        return F.binary_cross_entropy_with_logits(logits.float(), teacher.float(), reduction="none").mean(-1)

    def balanced_weights(self, targets: list, count: int) -> torch.Tensor:
        """Each label's pos_weight: its negatives over its positives."""
        positives = torch.tensor(targets, dtype=torch.float64).sum(dim=0)
        return ((len(targets) - positives) / positives.clamp(min=1)).float()

    def cell_values(self, value: Any, row: int, source: str, reader: LabelReader) -> list:
        return reader.row_values(value, row, source)

    def encode(self, value: Any, row: int, source: str, reader: LabelReader) -> list[float]:
        """A multi-hot row over the classes."""
        hot = [0.0] * reader.count
        for label in reader.row_values(value, row, source):
            hot[reader.class_id(label, row, source)] = 1.0
        return hot

    def metric_inputs(self, decided: torch.Tensor, references: torch.Tensor) -> tuple[list, list]:
        return decided.long().tolist(), references.long().tolist()

    def example(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        hot = torch.eye(count)
        return hot * 0.9 + 0.05, hot

    def prediction_names(self, labels: list[str]) -> list[str]:
        withheld = ["review"] if self.band else []
        return ["predicted_labels", "decision", *withheld, *[f"score_{label}" for label in labels]]

    def prediction_values(self, scores: torch.Tensor, labels: list[str]) -> dict[str, Any]:
        """The labels at their thresholds; `decision`: those outside the review band, `review`: those inside it."""
        decided = self.decided(scores)
        columns = {"predicted_labels": _named(self.decisions(scores).numpy(), labels)}
        columns["decision"] = _named(decided.chosen, labels)
        if self.band:
            columns["review"] = _named(decided.review, labels)
        return {**columns, **_per_label_scores(scores, labels)}

    def agreement(self, out: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Each label's decision; near-threshold scores are ties."""
        bounds = torch.tensor(self.thresholds)
        expected, got = ref.sigmoid(), out.sigmoid()
        decided = (expected - bounds).abs() >= TIE_MARGIN
        return (self.decisions(got) == self.decisions(expected))[decided], int((~decided).sum())

    def agreement_rule(self) -> str:
        return f"per-label decisions at thresholds {list(self.thresholds)}, ties within {TIE_MARGIN} left out"


class Regression(ProblemType):
    """One output: the raw value, no squashing."""

    name, function, classes = REGRESSION, NONE, False
    headline, selection = ("mse", "pearson", "spearman"), "mse"
    metric_sets = ("regression",)
    reports = ("residuals", "largest_errors")
    card_tag = "regression"
    # length-grouped batches would bias targets (docs/benchmarks.md)
    groups_by_length = False
    keeps_fp32 = True  # raw values: a precision drop moves them

    def check_outputs(self, num: int) -> None:
        if num != 1:  # what would 4 raw values ranked as label scores mean?
            raise ProblemTypeError(f"config.json: a {REGRESSION} model has one output here (has {num} in id2label)")

    def decisions(self, scores: torch.Tensor) -> torch.Tensor:
        return scores[..., 0]

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, weights, smoothing: float) -> torch.Tensor:
        return F.mse_loss(logits.float().squeeze(-1), labels.float(), reduction="none")

    def teacher_loss(self, logits: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
        return F.mse_loss(logits.float(), teacher.float(), reduction="none").mean(-1)

    def cell_values(self, value: Any, row: int, source: str, reader: LabelReader) -> list:
        reader.target(value, row, source)  # checked: a finite number float32 can train on
        return []

    def encode(self, value: Any, row: int, source: str, reader: LabelReader) -> float:
        return reader.target(value, row, source)

    def example(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor([[0.0], [1.0], [3.0]]), torch.tensor([0.5, 1.0, 2.0])

    def prediction_names(self, labels: list[str]) -> list[str]:
        return ["predicted_value"]

    def prediction_values(self, scores: torch.Tensor, labels: list[str]) -> dict[str, Any]:
        return {"predicted_value": self.decisions(scores).numpy()}

    def agreement(self, out: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Agrees within REGRESSION_TOLERANCE standard deviations of fp32's value."""
        bound = REGRESSION_TOLERANCE * ref[:, 0].std().clamp(min=1e-6)
        return (out[:, 0] - ref[:, 0]).abs() <= bound, 0

    def agreement_rule(self) -> str:
        return f"regression values within {REGRESSION_TOLERANCE} standard deviations of fp32's"


class Reranking(ProblemType):
    """One relevance logit per (query, passage) pair: BCE on grades scaled to [0, 1], a sigmoid, ranked per query."""

    name, function, classes, graded = RERANKING, SIGMOID, False, True
    headline, selection = ("ndcg_at_10", "mrr_at_10", "map"), "ndcg_at_10"
    metric_sets = ("ranking",)
    reports = ("largest_errors",)  # the pairs scored furthest from their relevance
    card_tag = "text-ranking"

    def check_outputs(self, num: int) -> None:
        if num != 1:
            raise ProblemTypeError(f"config.json: a {RERANKING} model has one output (has {num} in id2label)")

    def config_fields(self) -> dict[str, Any]:
        return {"problem_type": None}  # transformers knows three names; LabelSpace adds GRADES

    def decisions(self, scores: torch.Tensor) -> torch.Tensor:
        return scores[..., 0]

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, weights, smoothing: float) -> torch.Tensor:
        """Binary cross-entropy on the relevance in [0, 1]: graded labels are soft targets."""
        return F.binary_cross_entropy_with_logits(logits.float().squeeze(-1), labels.float(), reduction="none")

    def teacher_loss(self, logits: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
        """MSE on the logit: the teacher's relevance read back through the sigmoid it was served with."""
        return F.mse_loss(logits.float(), torch.logit(teacher.float().clamp(1e-6, 1 - 1e-6)), reduction="none").mean(-1)

    def cell_values(self, value: Any, row: int, source: str, reader: LabelReader) -> list:
        return [reader.grade(value, row, source)]

    def encode(self, value: Any, row: int, source: str, reader: LabelReader) -> float:
        return reader.relevance(value, row, source)

    def example(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor([[0.9], [0.2], [0.6]]), torch.tensor([1.0, 0.0, 0.5])

    def prediction_names(self, labels: list[str]) -> list[str]:
        return ["predicted_score"]

    def prediction_values(self, scores: torch.Tensor, labels: list[str]) -> dict[str, Any]:
        return {"predicted_score": self.decisions(scores).numpy()}

    def agreement(self, out: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, int]:
        """The sigmoid's side of 0.5; near-0.5 scores are ties."""
        expected, got = ref[:, 0].sigmoid(), out[:, 0].sigmoid()
        decided = (expected - DEFAULT_THRESHOLD).abs() >= TIE_MARGIN
        return ((got >= DEFAULT_THRESHOLD) == (expected >= DEFAULT_THRESHOLD))[decided], int((~decided).sum())

    def agreement_rule(self) -> str:
        return f"relevance decisions at {DEFAULT_THRESHOLD}, ties within {TIE_MARGIN} left out"


PROBLEM_TYPES: dict[str, type[ProblemType]] = {
    each.name: each for each in (SingleLabel, MultiLabel, Regression, Reranking)
}


def calibration_of(config: Any) -> dict:
    """The calibration record in config.json, or {}; ProblemTypeError for one training never writes."""
    record = getattr(config, CALIBRATION, None)
    if record is None:
        return {}
    method = record.get("method") if isinstance(record, dict) else None
    if method == "none":
        return record
    temperatures = record.get("temperatures", [record.get("temperature")]) if method == "temperature" else None
    if not isinstance(temperatures, list) or not temperatures or not all(_positive(t) for t in temperatures):
        raise ProblemTypeError(
            f'config.json: {CALIBRATION} must be {{"method": "none"}} or {{"method": "temperature", '
            f'"temperature": T}} with finite T > 0 (got {record!r:.80})'
        )
    outputs = getattr(config, "num_labels", None)
    if "temperatures" in record and outputs is not None and len(temperatures) != outputs:
        raise ProblemTypeError(
            f"config.json: {CALIBRATION} has {len(temperatures)} temperatures for the model's {outputs} outputs "
            "(one per output, as training writes them)"
        )
    return record


def _grade(number) -> bool:
    return isinstance(number, (int, float)) and not isinstance(number, bool) and math.isfinite(number) and number >= 0


def _range(pair) -> bool:
    return isinstance(pair, list) and len(pair) == 2 and all(map(_grade, pair)) and pair[0] <= pair[1]


def _positive(number) -> bool:
    return isinstance(number, (int, float)) and not isinstance(number, bool) and math.isfinite(number) and number > 0
