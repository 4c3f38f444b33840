"""Each problem type's object (contract/problem_types.py) fills the whole interface consistently: its example split
decides and scores through its own metric inputs, its prediction values are exactly its prediction names, a
candidate identical to fp32 agrees everywhere, its loss is one finite number per example, and a label cell reads
back as the target it encodes. A new type passes these by being registered in KINDS."""

from __future__ import annotations

import pytest
import torch

from contract.problem_types import KINDS, kind_of
from contract.task import Task, TaskError

LABELS = ["a", "b", "c"]


class Reader:
    """training/data/labels.py LabelSpace's part a problem type reads label cells through: classes a, b, c."""

    count = len(LABELS)

    def label_value(self, value, row, source):
        return value

    def class_id(self, value, row, source):
        return LABELS.index(value)

    def row_values(self, labels, row, source):
        return list(labels)

    def target(self, value, row, source):
        return float(value)


def outputs(kind) -> int:
    return len(LABELS) if kind.classes else 1


@pytest.mark.parametrize("name", KINDS)
def test_each_kind_fills_the_interface(name):
    kind, n = kind_of(name), outputs(kind_of(name))
    task = Task(name, n)
    scores, references = kind.example(n)
    decided = task.decisions(scores)
    predictions, refs = kind.metric_inputs(decided, references)
    assert len(predictions) == len(refs) == len(scores)
    if kind.classes:  # the example's scores decide its references (a regression example has errors to measure)
        assert predictions == refs
    labels = LABELS[:n] if kind.classes else ["value"]
    columns = kind.prediction_values(scores, decided, labels)
    assert list(columns) == kind.prediction_names(labels)
    assert all(len(column) == len(scores) for column in columns.values())
    logits = torch.randn(64, n, generator=torch.Generator().manual_seed(0))
    same, ties = kind.agreement(logits, logits.clone(), task.thresholds)
    assert bool(same.all()) and len(same) + ties >= len(logits)
    assert kind.agreement_rule(task.thresholds)
    targets = references if kind.classes else references.float()
    losses = kind.loss(scores.float(), targets, None, 0.0)
    assert losses.shape == (len(scores),) and torch.isfinite(losses).all()
    assert kind.batch_loss(scores.float(), targets, None, 0.0) == pytest.approx(losses.mean().item(), rel=1e-6)
    assert set(kind.reports) and kind.selection in kind.headline and kind.metric_modules
    matrix = kind.label_matrix(decided, n)
    if kind.classes:  # which labels each text has, decided or true: the same yes/no rows for this example
        assert matrix.shape == (len(scores), n) and matrix.dtype == torch.bool
        assert torch.equal(matrix, kind.label_matrix(references, n))
    else:
        assert matrix is None


@pytest.mark.parametrize(
    ("name", "cell", "target"),
    [
        ("single_label_classification", "b", 1),
        ("multi_label_classification", ["a", "c"], [1.0, 0.0, 1.0]),
        ("regression", 2.5, 2.5),
    ],
)
def test_a_label_cell_becomes_the_kinds_target(name, cell, target):
    assert kind_of(name).encode(cell, 1, "t", Reader()) == target


def test_an_unknown_problem_type_is_one_line_naming_the_known_ones():
    with pytest.raises(TaskError, match="problem_type 'ordinal' is not one of single_label_classification"):
        kind_of("ordinal")
