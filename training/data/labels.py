"""Labels as run_classification.py reads them: the problem type, the label space, and each row's target."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import datasets
import torch

from contract.problem_types import MULTI, REGRESSION, SINGLE, ProblemType
from training.config import TrainConfig
from training.data.errors import DataError


def _label_value(value, source: str, row: int):
    """A label's comparison key: int, bool or str."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, (bool, int, str)) and value != "":
        return value
    raise DataError(f"{source}: row {row}: label {value!r} is not a class (expected an integer or a string)")


# float32 sums of squared errors over 2^24 rows stay finite below this
SUMMED_ROWS = 2**24
LARGEST_TARGET = math.sqrt(torch.finfo(torch.float32).max / (4 * SUMMED_ROWS))


def _target(value, source: str, row: int) -> float:
    """A finite regression target whose summed squares stay finite in float32."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise DataError(f"{source}: row {row}: target {value!r} is not a finite number (regression)")
    if abs(value) > LARGEST_TARGET:
        raise DataError(
            f"{source}: row {row}: target {value!r} is too large for float32 training (the MSE loss sums squared "
            f"errors; |target| must be at most {LARGEST_TARGET:.3g}): rescale the targets"
        )
    return float(value)


def _grade(value, source: str, row: int) -> float:
    """A relevance grade: a finite number at least 0 (true/false as 1/0)."""
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise DataError(f"{source}: row {row}: relevance {value!r} is not a number >= 0 (reranking: 0/1 or grades)")
    return float(value)


def _is_list_feature(feature) -> bool:
    return isinstance(feature, (datasets.Sequence, datasets.List, datasets.LargeList))


def _problem_type(feature, values: list, cfg: TrainConfig) -> str:
    """--problem_type, else run_classification.py's rule: lists are multi-label, floats regression, else single."""
    delimiter, regression = cfg.label_delimiter, cfg.do_regression
    if cfg.problem_type:
        return cfg.problem_type
    if regression:
        return REGRESSION
    if delimiter is not None or _is_list_feature(feature) or any(isinstance(v, list) for v in values):
        return MULTI
    if regression is False:
        return SINGLE
    present = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    fractions = any(isinstance(v, float) and not v.is_integer() for v in present)
    floats = isinstance(feature, datasets.Value) and feature.dtype.startswith("float")
    # whole floats with gaps: integers with missing labels
    return REGRESSION if fractions or (floats and len(present) == len(values)) else SINGLE


def _check_one_label_type(feature, values: list, source: str, column: str) -> None:
    """One meaning per label column: no numbers mixed with strings or stray words."""
    if type(feature).__name__ == "Json" and not any(isinstance(v, (list, dict)) for v in values):
        raise DataError(
            f"{source}: column {column!r} mixes label types (numbers and strings): write every label as a number "
            "(regression) or every label as a string (classes)"
        )
    if not (isinstance(feature, datasets.Value) and "string" in feature.dtype):
        return
    numbers = [_as_number(v) for v in values]
    fractions = [v for v in numbers if v is not None and not v.is_integer()]
    if not fractions or 2 * sum(v is not None for v in numbers) < len(values):
        return
    words = [(row, v) for row, (v, n) in enumerate(zip(values, numbers), start=1) if n is None]
    where = f"row {words[0][0]} holds {words[0][1]!r}, which is not a number" if words else "all are written as text"
    raise DataError(
        f"{source}: column {column!r} holds fractional numbers ({fractions[0]:g}, ...) but {where}: fix the row for "
        f"regression, or pass --do_regression false to train {len(set(values))} classes named by these values"
    )


def _check_label_names(names: list[str], source: str) -> None:
    """No control characters or `|` in label names (csv headers, list cells)."""
    for name in names:
        if "|" in name or any(ord(c) < 32 or ord(c) == 127 for c in name):
            raise DataError(
                f"{source}: label {name!r} holds '|' or a control character (prediction files join labels with '|' "
                "and name columns after them): pass --label_delimiter '|' if it lists several labels, or rename the "
                "labels with --label_names"
            )


STRAY_SHARE = 0.05  # words in at most this share of the rows, beside integer labels: taken for typos


def _refuse_stray_words(raw: list, values: list, source: str, column: str) -> None:
    """Integer labels written as text beside a rare word (`Weather` among 0-3): a typo would become a class."""
    if not all(isinstance(v, str) for v in values):
        return
    words = [v for v in values if not v.lstrip("-").isdigit()]
    if not words or len(values) - len(words) < 2:
        return
    rows = [row for row, cell in enumerate(raw, start=1) if cell in words]
    if len(rows) > STRAY_SHARE * len(raw):
        return
    raise DataError(
        f"{source}: column {column!r} holds integer labels ({', '.join(v for v in values if v not in words)}) and "
        f"{', '.join(map(repr, words))} in {len(rows)} row(s) (row {rows[0]}): a typo? Fix the row, or, if it is a "
        f"class, name all {len(values)} with --label_names (in id order: {', '.join(values)})"
    )


def _as_number(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


@dataclass
class LabelSpace:
    """Labels as `run_classification.py` reads them: the training data's sorted values are ids 0..N-1, named as found
    unless --label_names renames them; a Hub ClassLabel keeps its own."""

    values: list  # ([] for regression)
    names: list[str]
    source: str  # where the values were found, for error messages
    problem_type: str = SINGLE
    delimiter: str | None = None  # --label_delimiter: a multi-label string column's separator

    @classmethod
    def of_training_data(cls, ds: datasets.Dataset, source: str, column: str, cfg: TrainConfig) -> LabelSpace:
        feature, raw = ds.features[column], ds[column]
        problem = ProblemType.named(_problem_type(feature, raw, cfg))
        if not problem.label_lists and cfg.do_regression is None and not problem.graded:
            _check_one_label_type(feature, raw, source, column)
        if cfg.threshold_strategy == "per_label" and not problem.thresholded:
            raise DataError(
                f"--threshold_strategy per_label fits a threshold per label of multi-label data; {source} column "
                f"{column!r} is {problem.name}"
            )
        names = cfg.label_names
        space = cls(values=[], names=[], source=source, problem_type=problem.name, delimiter=cfg.label_delimiter)
        inner = getattr(feature, "feature", feature)
        if isinstance(inner, datasets.ClassLabel):  # ids and names given: no pass over rows
            seen = set()
        else:  # every cell read and checked once
            seen = {v for row, cell in enumerate(raw, start=1) for v in problem.cell_values(cell, row, source, space)}
        if not problem.classes:
            if names and len(names) != 1:
                raise DataError(f"label_names: a {problem.name} model has one output; give one name (got {len(names)})")
            grades = sorted(seen)  # reranking's; regression has none
            if problem.graded and (len(grades) < 2 or grades[0] != 0):
                raise DataError(
                    f"{source}: column {column!r} holds relevance {', '.join(f'{g:g}' for g in grades)}: reranking "
                    "needs 0 (not relevant) and at least one higher grade"
                )
            return cls(values=grades, names=list(names or [column]), source=source, problem_type=problem.name)
        if isinstance(inner, datasets.ClassLabel):
            values, found = list(range(inner.num_classes)), list(inner.names)
        else:
            if len({type(v) for v in seen}) > 1:
                raise DataError(f"{source}: column {column!r} mixes label types ({sorted(map(repr, seen))[:6]})")
            values = sorted(seen)
            found = [str(v) for v in values]
            if not names and not problem.label_lists:
                _refuse_stray_words(raw, values, source, column)
        if len(values) < 2:
            raise DataError(
                f"{source}: column {column!r} has {len(values)} distinct label(s); a classifier needs two or more"
            )
        if names and len(names) != len(values):
            raise DataError(
                f"label_names: {len(names)} names for the {len(values)} label values of {source} "
                f"({', '.join(map(str, values))}, in id order)"
            )
        space.values, space.names = values, list(names or found)
        _check_label_names(space.names, source if not names else "--label_names")
        return space

    @property
    def problem(self) -> ProblemType:
        """The model's problem type, default thresholds."""
        return ProblemType.named(self.problem_type, len(self.names))

    @property
    def count(self) -> int:
        return len(self.values)

    def label_value(self, value, row: int, source: str):
        return _label_value(value, source, row)

    def target(self, value, row: int, source: str) -> float:
        return _target(value, source, row)

    def grade(self, value, row: int, source: str) -> float:
        return _grade(value, source, row)

    def relevance(self, value, row: int, source: str) -> float:
        """A grade over the largest training grade: the BCE target in [0, 1]."""
        top = max(self.values) if self.values else 1.0
        grade = _grade(value, source, row)
        if grade > top:
            raise DataError(f"{source}: row {row}: relevance {value!r} is above the training data's largest, {top:g}")
        return grade / top

    def row_values(self, labels, row: int, source: str | None = None) -> list:
        """A multi-label row's values; empty is an error."""
        source = source or self.source
        if self.delimiter is not None and isinstance(labels, str):
            labels = [part.strip() for part in labels.split(self.delimiter) if part.strip()]
        if not isinstance(labels, list):
            raise DataError(f"{source}: row {row}: labels {labels!r} are not a list (multi-label)")
        if not labels:
            raise DataError(f"{source}: row {row}: no labels; every multi-label example needs one or more")
        return [_label_value(value, source, row) for value in labels]

    def class_id(self, value, row: int, source: str) -> int:
        """A known class's id; an unknown one is an error."""
        key = _label_value(value, source, row)
        index = self._ids.get(key)
        if index is None and not isinstance(key, bool):  # 3 in one file is "3" in another (csv types columns apart)
            index = self._ids.get(str(key) if isinstance(key, int) else int(key) if key.lstrip("-").isdigit() else key)
        if index is None and isinstance(key, str) and key in self.names and self.names != [str(v) for v in self.values]:
            index = self.names.index(key)  # ids named (a ClassLabel, --label_names): another file may use the names
        if index is None or isinstance(key, bool) != isinstance(self.values[0], bool):
            raise DataError(
                f"{source}: row {row}: label {value!r} never appears in the training data "
                f"({self.source}: {', '.join(map(str, self.values))})"
            )
        return index

    @functools.cached_property
    def _ids(self) -> dict:
        return {v: i for i, v in enumerate(self.values)}

    def encode(self, ds: datasets.Dataset, source: str, column: str) -> list:
        """Every row's label as the model's target."""
        return [self.problem.encode(value, row, source, self) for row, value in enumerate(ds[column], start=1)]
