"""Each problem type's object fills the whole interface consistently."""

from __future__ import annotations

import pytest
import torch

from contract.problem_types import PROBLEM_TYPES, ProblemType, ProblemTypeError

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


@pytest.mark.parametrize("name", PROBLEM_TYPES)
def test_each_problem_type_fills_the_interface(name):
    n = len(LABELS) if PROBLEM_TYPES[name].classes else 1
    problem = ProblemType.named(name, n)
    scores, references = problem.example(n)
    decided = problem.decisions(scores)
    predictions, refs = problem.metric_inputs(decided, references)
    assert len(predictions) == len(refs) == len(scores)
    if problem.classes:  # the example's scores decide its references (a regression example has errors to measure)
        assert predictions == refs
    labels = LABELS[:n] if problem.classes else ["value"]
    columns = problem.prediction_values(scores, labels)
    assert list(columns) == problem.prediction_names(labels)
    assert all(len(column) == len(scores) for column in columns.values())
    logits = torch.randn(64, n, generator=torch.Generator().manual_seed(0))
    same, ties = problem.agreement(logits, logits.clone())
    assert bool(same.all()) and len(same) + ties >= len(logits)
    assert problem.agreement_rule()
    targets = references if problem.classes else references.float()
    losses = problem.loss(scores.float(), targets, None, 0.0)
    assert losses.shape == (len(scores),) and torch.isfinite(losses).all()
    assert problem.batch_loss(scores.float(), targets, None, 0.0) == pytest.approx(losses.mean().item(), rel=1e-6)
    assert set(problem.reports) and problem.selection in problem.headline and problem.metric_sets
    matrix = problem.label_matrix(decided, n)
    if problem.classes:  # which labels each text has, decided or true: the same yes/no rows for this example
        assert matrix.shape == (len(scores), n) and matrix.dtype == torch.bool
        assert torch.equal(matrix, problem.label_matrix(references, n))
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
def test_a_label_cell_becomes_the_problem_types_target(name, cell, target):
    assert ProblemType.named(name).encode(cell, 1, "t", Reader()) == target


def test_an_unknown_problem_type_is_one_line_naming_the_known_ones():
    with pytest.raises(ProblemTypeError, match="problem_type 'ordinal' is not one of single_label_classification"):
        ProblemType.named("ordinal")
